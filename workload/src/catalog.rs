//! The built-in workload catalog: CARMA's published workloads in carma's own
//! format.
//!
//! Each entry restates a published figure from CARMA's v2 profile (re-profiled
//! Nov 2025 on an A100 40 GB): exclusive minutes per epoch × epochs, and the
//! measured peak GPU memory (`memory.used`, MiB, as in the v2 task files). The
//! `recorded` column is the GPUMemNet estimate the v2 task file carries (line 11;
//! 40000 means "not available"). MNIST's run time is from `task-durations.csv`;
//! EfficientNet-B0 on CIFAR-100 at batch 128 uses the task file's 866 MiB (the
//! published table's "8.67 GB" is a misprint of 0.867).
//!
//! The architecture of each model is what GPUMemNet's features need: parameter
//! counts are the models' published counts (torchvision / timm / Hugging Face);
//! activations per sample come from the torchsummary tables in
//! `../shared/data/model-summaries` for the CIFAR and MNIST models and are
//! estimated from layer shapes (±30 %) for the others. They feed the estimator;
//! the simulated truth is the measured peak.

use carma_core::Millis;
use serde::Serialize;

use crate::model::{Activity, ActivityClass};
use carma_estimator::{Family, Layers};

use crate::profile::Architecture;

/// Job size classes of CARMA's traces (about 65 / 27 / 8 % in the mixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum SizeClass {
    /// CIFAR-100 and MNIST jobs.
    Light,
    /// Single-GPU ImageNet CNNs, BERT, UNet, DLRM.
    Medium,
    /// Multi-GPU Transformers and Mask R-CNN.
    Heavy,
}

impl SizeClass {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            SizeClass::Light => "light",
            SizeClass::Medium => "medium",
            SizeClass::Heavy => "heavy",
        }
    }
}

/// One catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Workload {
    /// Stable key, e.g. `resnet50-b32`.
    pub key: &'static str,
    /// Model name.
    pub model: &'static str,
    /// Data set.
    pub dataset: &'static str,
    /// CARMA task files (`.rad` base names) that run this workload.
    pub rad: &'static [&'static str],
    /// Batch size.
    pub batch_size: u32,
    /// GPUs per task.
    pub gpus: u32,
    /// Epochs.
    pub epochs: u32,
    /// Exclusive minutes per epoch.
    pub minutes_per_epoch: f64,
    /// Measured peak GPU memory per GPU (MiB).
    pub peak_mib: u64,
    /// GPUMemNet estimate recorded in the task file (MiB), when it has one.
    pub recorded_mib: Option<u64>,
    /// Activity class.
    pub class: ActivityClass,
    /// Size class for trace generation.
    pub size: SizeClass,
    /// Architecture for the estimator.
    #[serde(skip)]
    pub arch: &'static Architecture,
}

impl Workload {
    /// Exclusive run time in milliseconds.
    pub fn exclusive_ms(&self) -> Millis {
        (self.minutes_per_epoch * self.epochs as f64 * 60_000.0).round() as Millis
    }

    /// Activity when running alone.
    pub fn activity(&self) -> Activity {
        self.class.activity(self.batch_size)
    }
}

/// Find a workload by key.
pub fn by_key(key: &str) -> Option<&'static Workload> {
    CATALOG.iter().find(|w| w.key == key)
}

/// Find the workload a CARMA task file (base name, e.g. `resnet2.rad`) runs.
pub fn by_rad(rad: &str) -> Option<&'static Workload> {
    CATALOG.iter().find(|w| w.rad.contains(&rad))
}

const fn layers(
    conv2d: u32,
    batch_norm: u32,
    linear: u32,
    dropout: u32,
    adaptive_avg_pool: u32,
) -> Layers {
    Layers {
        linear,
        conv2d,
        batch_norm,
        dropout,
        layer_norm: 0,
        attention: 0,
        adaptive_avg_pool,
    }
}

const fn cnn(
    parameters: u64,
    activations: u64,
    activation: &'static str,
    l: Layers,
) -> Architecture {
    Architecture {
        family: Family::Cnn,
        parameters,
        activations,
        activation,
        layers: l,
        seq_length: None,
    }
}

const fn transformer(
    parameters: u64,
    activations: u64,
    blocks: u32,
    seq_length: u32,
) -> Architecture {
    // Per block: Q, K, V and two feed-forward linears (the output projection is
    // the attention count), two layer norms, three dropouts; plus a head.
    Architecture {
        family: Family::Transformer,
        parameters,
        activations,
        activation: "GELU",
        layers: Layers {
            linear: 5 * blocks + 2,
            conv2d: 0,
            batch_norm: 0,
            dropout: 3 * blocks + 1,
            layer_norm: 2 * blocks + 1,
            attention: blocks,
            adaptive_avg_pool: 0,
        },
        seq_length: Some(seq_length),
    }
}

static EFFICIENTNET_B0: Architecture = cnn(5_288_548, 31_200_000, "SiLU", layers(81, 49, 1, 1, 17));
static RESNET50: Architecture = cnn(25_557_032, 37_560_000, "ReLU", layers(53, 53, 1, 0, 1));
static MOBILENET_V2: Architecture = cnn(3_504_872, 20_040_000, "ReLU", layers(52, 52, 1, 1, 1));
static VGG16: Architecture = cnn(138_357_544, 28_680_000, "ReLU", layers(13, 0, 3, 2, 1));
static XCEPTION: Architecture = cnn(22_855_952, 50_000_000, "ReLU", layers(74, 40, 1, 0, 1));
static INCEPTION_V3: Architecture = cnn(27_161_264, 34_000_000, "ReLU", layers(94, 94, 2, 1, 1));
static UNET: Architecture = cnn(31_037_633, 120_000_000, "ReLU", layers(23, 18, 0, 0, 0));
static MASKRCNN: Architecture = cnn(44_401_393, 400_000_000, "ReLU", layers(72, 53, 4, 0, 1));
static MNIST_CNN: Architecture = cnn(1_199_882, 68_157, "ReLU", layers(2, 0, 2, 2, 0));
static EFFICIENTNET_B0_CIFAR: Architecture =
    cnn(4_135_648, 635_699, "SiLU", layers(81, 49, 1, 0, 17));
static RESNET18_CIFAR: Architecture = cnn(11_227_812, 200_540, "ReLU", layers(20, 20, 1, 0, 1));
static RESNET34_CIFAR: Architecture = cnn(21_335_972, 315_884, "ReLU", layers(36, 36, 1, 0, 1));
static MOBILENET_V3S_CIFAR: Architecture =
    cnn(1_620_356, 150_000, "ReLU", layers(52, 34, 2, 1, 10));
static DLRM: Architecture = Architecture {
    family: Family::Mlp,
    parameters: 929_473,
    activations: 3_137,
    activation: "ReLU",
    layers: layers(0, 0, 8, 0, 0),
    seq_length: None,
};
static BERT_BASE: Architecture = transformer(109_482_240, 160_000_000, 12, 512);
static BERT_LARGE: Architecture = transformer(335_141_888, 428_000_000, 24, 512);
static XLNET_BASE: Architecture = transformer(116_718_336, 160_000_000, 12, 512);
static XLNET_LARGE: Architecture = transformer(360_268_800, 430_000_000, 24, 512);
static GPT2_LARGE: Architecture = transformer(774_030_080, 803_000_000, 36, 512);

macro_rules! w {
    ($key:literal, $model:literal, $data:literal, [$($rad:literal),*], b $b:literal, g $g:literal,
     $epochs:literal x $min:literal, $peak:literal, $rec:expr, $class:ident, $size:ident, $arch:ident) => {
        Workload {
            key: $key,
            model: $model,
            dataset: $data,
            rad: &[$($rad),*],
            batch_size: $b,
            gpus: $g,
            epochs: $epochs,
            minutes_per_epoch: $min,
            peak_mib: $peak,
            recorded_mib: $rec,
            class: ActivityClass::$class,
            size: SizeClass::$size,
            arch: &$arch,
        }
    };
}

/// Every built-in workload.
pub static CATALOG: &[Workload] = &[
    // ImageNet CNNs, one epoch.
    w!("efficientnet_b0-b32", "EfficientNet-B0", "ImageNet", ["efficientNet.rad"], b 32, g 1, 1 x 41.96, 3752, Some(8000), Vision, Medium, EFFICIENTNET_B0),
    w!("efficientnet_b0-b64", "EfficientNet-B0", "ImageNet", ["efficientNet2.rad"], b 64, g 1, 1 x 28.48, 6692, Some(16000), Vision, Medium, EFFICIENTNET_B0),
    w!("efficientnet_b0-b128", "EfficientNet-B0", "ImageNet", ["efficientNet3.rad"], b 128, g 1, 1 x 27.52, 12666, Some(16000), Vision, Medium, EFFICIENTNET_B0),
    w!("resnet50-b32", "ResNet-50", "ImageNet", ["resnet.rad"], b 32, g 1, 1 x 34.96, 3934, Some(16000), Vision, Medium, RESNET50),
    w!("resnet50-b64", "ResNet-50", "ImageNet", ["resnet2.rad"], b 64, g 1, 1 x 32.58, 7106, Some(16000), Vision, Medium, RESNET50),
    w!("resnet50-b128", "ResNet-50", "ImageNet", ["resnet3.rad"], b 128, g 1, 1 x 31.27, 13236, Some(24000), Vision, Medium, RESNET50),
    w!("mobilenet_v2-b32", "MobileNetV2", "ImageNet", ["mobilenet.rad"], b 32, g 1, 1 x 29.47, 3352, Some(8000), Vision, Medium, MOBILENET_V2),
    w!("mobilenet_v2-b64", "MobileNetV2", "ImageNet", ["mobilenet2.rad"], b 64, g 1, 1 x 25.70, 6032, Some(16000), Vision, Medium, MOBILENET_V2),
    w!("mobilenet_v2-b128", "MobileNetV2", "ImageNet", ["mobilenet3.rad"], b 128, g 1, 1 x 25.44, 11336, Some(16000), Vision, Medium, MOBILENET_V2),
    w!("vgg16-b32", "VGG-16", "ImageNet", ["vgg.rad"], b 32, g 1, 1 x 50.77, 6684, Some(16000), Vision, Medium, VGG16),
    w!("vgg16-b64", "VGG-16", "ImageNet", ["vgg2.rad"], b 64, g 1, 1 x 46.70, 11760, Some(16000), Vision, Medium, VGG16),
    w!("vgg16-b128", "VGG-16", "ImageNet", ["vgg3.rad"], b 128, g 1, 1 x 44.60, 21864, Some(24000), Vision, Medium, VGG16),
    w!("xception-b32", "Xception", "ImageNet", ["Xception.rad"], b 32, g 1, 1 x 49.86, 5918, Some(16000), Vision, Medium, XCEPTION),
    w!("xception-b64", "Xception", "ImageNet", ["Xception2.rad"], b 64, g 1, 1 x 48.82, 11106, Some(16000), Vision, Medium, XCEPTION),
    w!("xception-b128", "Xception", "ImageNet", ["Xception3.rad"], b 128, g 1, 1 x 47.57, 21236, Some(24000), Vision, Medium, XCEPTION),
    w!("inception_v3-b32", "Inception-v3", "ImageNet", ["Inception.rad"], b 32, g 1, 1 x 58.75, 5230, Some(8000), Vision, Medium, INCEPTION_V3),
    w!("inception_v3-b64", "Inception-v3", "ImageNet", ["Inception2.rad"], b 64, g 1, 1 x 51.27, 9332, Some(16000), Vision, Medium, INCEPTION_V3),
    w!("inception_v3-b128", "Inception-v3", "ImageNet", ["Inception3.rad"], b 128, g 1, 1 x 49.80, 17830, Some(16000), Vision, Medium, INCEPTION_V3),
    // Transformers on WikiText-2.
    w!("xlnet_base-b8", "XLNet-base", "WikiText-2", ["xlnet_base_cased_2.rad"], b 8, g 2, 8 x 7.38, 9192, Some(16000), Transformer, Heavy, XLNET_BASE),
    w!("bert_base-b32", "BERT-base", "WikiText-2", ["BERT_base.rad"], b 32, g 1, 1 x 14.92, 19828, Some(32000), Transformer, Medium, BERT_BASE),
    w!("xlnet_large-b4", "XLNet-large", "WikiText-2", ["xlnet_large_cased_2.rad"], b 4, g 2, 3 x 19.58, 19330, Some(16000), Transformer, Heavy, XLNET_LARGE),
    w!("bert_large-b8", "BERT-large", "WikiText-2", ["BERT_large.rad"], b 8, g 1, 1 x 44.93, 12622, Some(24000), Transformer, Medium, BERT_LARGE),
    w!("gpt2_large-b8", "GPT-2 large", "WikiText-2", ["gpt2_large_2.rad"], b 8, g 2, 1 x 65.72, 28356, None, Transformer, Heavy, GPT2_LARGE),
    // Other domains.
    w!("unet-b8", "UNet", "VOC", ["UNet.rad"], b 8, g 1, 90 x 0.35, 9910, Some(8000), Vision, Medium, UNET),
    w!("maskrcnn-b8", "Mask R-CNN (ResNet-50 FPN)", "COCO", ["maskrcnn.rad"], b 8, g 1, 1 x 112.07, 28606, Some(8000), Vision, Heavy, MASKRCNN),
    w!("dlrm-b32768", "DLRM", "Criteo Terabyte", ["dlrm.rad"], b 32768, g 1, 1 x 25.24, 1468, None, Recsys, Medium, DLRM),
    w!("mnist_cnn-b32", "MNIST CNN", "MNIST", ["mnist_train.rad"], b 32, g 1, 1 x 2.0, 1776, Some(8000), Small, Light, MNIST_CNN),
    // CIFAR-100, 20 and 50 epochs.
    w!("efficientnet_b0_cifar-b32-e20", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_20e_1.rad"], b 32, g 1, 20 x 1.06, 666, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("efficientnet_b0_cifar-b64-e20", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_20e_2.rad"], b 64, g 1, 20 x 1.09, 720, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("efficientnet_b0_cifar-b128-e20", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_20e_3.rad"], b 128, g 1, 20 x 1.14, 866, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("efficientnet_b0_cifar-b32-e50", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_50e_1.rad"], b 32, g 1, 50 x 1.06, 666, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("efficientnet_b0_cifar-b64-e50", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_50e_2.rad"], b 64, g 1, 50 x 1.09, 720, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("efficientnet_b0_cifar-b128-e50", "EfficientNet-B0", "CIFAR-100", ["efficientNet_cifar100_50e_3.rad"], b 128, g 1, 50 x 1.14, 866, Some(8000), Small, Light, EFFICIENTNET_B0_CIFAR),
    w!("resnet18_cifar-b32-e20", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_20e_1.rad"], b 32, g 1, 20 x 0.49, 788, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet18_cifar-b64-e20", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_20e_2.rad"], b 64, g 1, 20 x 0.23, 796, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet18_cifar-b128-e20", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_20e_3.rad"], b 128, g 1, 20 x 0.17, 858, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet18_cifar-b32-e50", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_50e_1.rad"], b 32, g 1, 50 x 0.49, 788, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet18_cifar-b64-e50", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_50e_2.rad"], b 64, g 1, 50 x 0.23, 796, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet18_cifar-b128-e50", "ResNet-18", "CIFAR-100", ["resnet18_cifar100_50e_3.rad"], b 128, g 1, 50 x 0.17, 858, Some(8000), Small, Light, RESNET18_CIFAR),
    w!("resnet34_cifar-b32-e20", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_20e_1.rad"], b 32, g 1, 20 x 0.83, 1002, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("resnet34_cifar-b64-e20", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_20e_2.rad"], b 64, g 1, 20 x 0.44, 1016, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("resnet34_cifar-b128-e20", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_20e_3.rad"], b 128, g 1, 20 x 0.22, 1074, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("resnet34_cifar-b32-e50", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_50e_1.rad"], b 32, g 1, 50 x 0.83, 1002, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("resnet34_cifar-b64-e50", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_50e_2.rad"], b 64, g 1, 50 x 0.44, 1016, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("resnet34_cifar-b128-e50", "ResNet-34", "CIFAR-100", ["resnet34_cifar100_50e_3.rad"], b 128, g 1, 50 x 0.22, 1074, Some(8000), Small, Light, RESNET34_CIFAR),
    w!("mobilenet_v3s_cifar-b32-e20", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_20e_1.rad"], b 32, g 1, 20 x 0.95, 590, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
    w!("mobilenet_v3s_cifar-b64-e20", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_20e_2.rad"], b 64, g 1, 20 x 0.50, 598, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
    w!("mobilenet_v3s_cifar-b128-e20", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_20e_3.rad"], b 128, g 1, 20 x 0.31, 632, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
    w!("mobilenet_v3s_cifar-b32-e50", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_50e_1.rad"], b 32, g 1, 50 x 0.95, 590, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
    w!("mobilenet_v3s_cifar-b64-e50", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_50e_2.rad"], b 64, g 1, 50 x 0.50, 598, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
    w!("mobilenet_v3s_cifar-b128-e50", "MobileNetV3-small", "CIFAR-100", ["mobilenet_cifar100_50e_3.rad"], b 128, g 1, 50 x 0.31, 632, Some(8000), Small, Light, MOBILENET_V3S_CIFAR),
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn keys_and_task_files_are_unique() {
        let keys: HashSet<_> = CATALOG.iter().map(|w| w.key).collect();
        assert_eq!(keys.len(), CATALOG.len());
        let rads: Vec<_> = CATALOG.iter().flat_map(|w| w.rad.iter()).collect();
        let unique: HashSet<_> = rads.iter().collect();
        assert_eq!(unique.len(), rads.len());
    }

    #[test]
    fn every_entry_is_sane() {
        for w in CATALOG {
            assert!(w.exclusive_ms() > 0, "{}", w.key);
            assert!(w.peak_mib > 0 && w.peak_mib < 40_960, "{}", w.key);
            assert!(w.gpus >= 1 && w.gpus <= 2, "{}", w.key);
            let a = w.activity();
            assert!(a.sm_activity > 0.0 && a.sm_activity <= 1.0, "{}", w.key);
        }
    }

    #[test]
    fn every_size_class_is_present() {
        for size in [SizeClass::Light, SizeClass::Medium, SizeClass::Heavy] {
            assert!(CATALOG.iter().any(|w| w.size == size));
        }
    }

    #[test]
    fn published_figures_are_restated() {
        let r = by_rad("resnet3.rad").unwrap();
        assert_eq!((r.batch_size, r.peak_mib), (128, 13236));
        assert_eq!(by_key("gpt2_large-b8").unwrap().gpus, 2);
        assert_eq!(by_key("xlnet_base-b8").unwrap().exclusive_ms(), 3_542_400);
    }
}
