//! The torchsummary parser on the real tables in ../shared/data/model-summaries,
//! and on malformed input.

mod common;

use carma_estimator::{EstimateSource, Estimator, Family, SummaryError, parse_torchsummary};

const FILES: [&str; 5] = [
    "efficientNet_cifar100.model",
    "mnist_cnn_64.model",
    "mobilenet_cifar100.model",
    "resnet18_cifar100.model",
    "resnet34_cifar100.model",
];

fn read(name: &str) -> String {
    std::fs::read_to_string(common::shared_file(&format!("model-summaries/{name}"))).unwrap()
}

#[test]
fn mnist_cnn_by_hand() {
    let p = parse_torchsummary(&read("mnist_cnn_64.model"), Family::Cnn, 64).unwrap();
    assert_eq!(p.parameters, 1_199_882);
    // 32·26·26 + 64·24·24 + 64·12·12 + 128 + 128 + 10
    assert_eq!(p.activations, 21_632 + 36_864 + 9_216 + 128 + 128 + 10);
    assert_eq!(
        (p.layers.conv2d, p.layers.dropout, p.layers.linear),
        (2, 2, 2)
    );
    assert_eq!(p.depth, Some(6));
    assert_eq!(p.activation.as_deref(), Some("ReLU")); // none listed: the default
    assert_eq!(p.batch_size, 64);
}

#[test]
fn resnet18_counts() {
    let p = parse_torchsummary(&read("resnet18_cifar100.model"), Family::Cnn, 32).unwrap();
    assert_eq!(p.parameters, 11_227_812);
    assert_eq!(p.layers.conv2d, 20);
    assert_eq!(p.layers.batch_norm, 20);
    assert_eq!(p.layers.linear, 1);
    assert_eq!(p.layers.adaptive_avg_pool, 1);
    assert_eq!(p.activation.as_deref(), Some("ReLU"));
    assert_eq!(p.depth, Some(20 + 20 + 1 + 1));
}

#[test]
fn every_shared_summary_parses_and_estimates() {
    let est = Estimator::new().unwrap();
    for name in FILES {
        let text = read(name);
        let p =
            parse_torchsummary(&text, Family::Cnn, 32).unwrap_or_else(|e| panic!("{name}: {e}"));
        let total: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("Total params:"))
            .map(|t| t.trim().replace(',', "").parse().unwrap())
            .unwrap();
        assert_eq!(p.parameters, total, "{name}");
        assert!(p.activations > 0 && p.layers.conv2d > 0, "{name}: {p:?}");
        let e = est.estimate(&p).unwrap();
        assert_eq!(
            e.source,
            EstimateSource::AnalyticUpperBound,
            "{name}: no CNN model yet"
        );
        assert!(e.mib >= 1536 && e.probabilities.is_empty(), "{name}: {e:?}");
    }
    // EfficientNet/MobileNet (timm) use SiLU
    let p = parse_torchsummary(&read("efficientNet_cifar100.model"), Family::Cnn, 8).unwrap();
    assert_eq!(p.activation.as_deref(), Some("SiLU"));
}

#[test]
fn malformed_tables_are_rejected() {
    let good = read("mnist_cnn_64.model");
    assert_eq!(
        parse_torchsummary("", Family::Cnn, 1),
        Err(SummaryError::MissingHeader)
    );
    assert_eq!(
        parse_torchsummary("hello\nworld", Family::Cnn, 1),
        Err(SummaryError::MissingHeader)
    );
    assert_eq!(
        parse_torchsummary(&good, Family::Cnn, 0),
        Err(SummaryError::BadBatchSize(0))
    );

    let header_only: String = good.lines().take(3).collect::<Vec<_>>().join("\n");
    assert_eq!(
        parse_torchsummary(&header_only, Family::Cnn, 1),
        Err(SummaryError::NoLayers)
    );

    for (from, to) in [
        ("[-1, 32, 26, 26]", "[-1, 32, x, 26]"),
        ("[-1, 32, 26, 26]", "-1, 32, 26, 26"),
        ("18,496", "many"),
        ("Conv2d-1", "Conv2d"),
        ("[-1, 64, 12, 12]", "[-1, 64, 99999999999, 99999999999]"),
    ] {
        let bad = good.replacen(from, to, 1);
        let e = parse_torchsummary(&bad, Family::Cnn, 1).unwrap_err();
        assert!(
            matches!(e, SummaryError::BadRow { .. }),
            "{from} -> {to}: {e:?}"
        );
        assert!(e.to_string().contains("line"), "{e}");
    }
    let bad = good.replace("Total params: 1,199,882", "Total params: lots");
    assert!(matches!(
        parse_torchsummary(&bad, Family::Cnn, 1),
        Err(SummaryError::BadTotal { .. })
    ));
    // without the Total line, the rows are summed
    let no_total = good.replace("Total params: 1,199,882", "");
    assert_eq!(
        parse_torchsummary(&no_total, Family::Cnn, 1)
            .unwrap()
            .parameters,
        1_199_882
    );
    // truncated in the middle of the table still yields the rows read so far
    let cut: String = good.lines().take(6).collect::<Vec<_>>().join("\n");
    let p = parse_torchsummary(&cut, Family::Cnn, 1).unwrap();
    assert_eq!(p.layers.conv2d, 2);
}

#[test]
fn multi_output_rows_and_explicit_batch_dimension() {
    let t = "        Layer (type)               Output Shape         Param #\n\
             ================================================================\n\
                       Linear-1                  [32, 100]          78,500\n\
                         LSTM-2     [[32, 8, 20], [1, 32, 20]]           1,000\n\
                    LayerNorm-3                   [32, 20]              40\n\
             NonDynamicallyQuantizableLinear-4    [32, 20]             420\n\
                      Dropout-5                   [32, 20]               0\n\
                         GELU-6                   [32, 20]               0\n\
             ================================================================\n";
    let p = parse_torchsummary(t, Family::Transformer, 32).unwrap();
    assert_eq!(p.activations, 100 + (160 + 640) + 20 + 20 + 20 + 20);
    assert_eq!(p.parameters, 78_500 + 1_000 + 40 + 420);
    assert_eq!(
        (
            p.layers.linear,
            p.layers.attention,
            p.layers.layer_norm,
            p.layers.dropout
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(p.activation.as_deref(), Some("GELU"));
    assert_eq!(p.depth, Some(4));
}

/// `--batch-size 4294967295` used to give 6.5e9 MiB with exit 0; it is refused with the range.
#[test]
fn batch_size_is_bounded() {
    let good = read("mnist_cnn_64.model");
    let e = parse_torchsummary(&good, Family::Cnn, u32::MAX).unwrap_err();
    assert_eq!(e, SummaryError::BadBatchSize(u32::MAX));
    assert!(e.to_string().contains("1 to 1048576"), "{e}");
    parse_torchsummary(&good, Family::Cnn, 1 << 20).unwrap();
}

/// A hand-edited `Total params` line used to be trusted over the rows; a mismatch is refused.
#[test]
fn total_params_must_agree_with_the_rows() {
    let good = read("mnist_cnn_64.model");
    let line = good
        .lines()
        .position(|l| l.starts_with("Total params:"))
        .unwrap()
        + 1;
    let edited = good.replace("Total params: 1,199,882", "Total params: 999,999,999,999");
    let e = parse_torchsummary(&edited, Family::Cnn, 1).unwrap_err();
    assert_eq!(
        e,
        SummaryError::TotalMismatch {
            line,
            total: 999_999_999_999,
            rows: 1_199_882
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("999999999999") && msg.contains("1199882"),
        "{msg}"
    );
}

/// A CNN table used to be accepted with `--family mlp`; layers outside the family are refused.
#[test]
fn layers_must_fit_the_family() {
    let cnn = read("mnist_cnn_64.model");
    let e = parse_torchsummary(&cnn, Family::Mlp, 8).unwrap_err();
    assert!(
        matches!(
            e,
            SummaryError::WrongFamily {
                family: Family::Mlp,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("2 Conv2d"), "{e}");
    let e = parse_torchsummary(&cnn, Family::Transformer, 8).unwrap_err();
    assert!(matches!(e, SummaryError::WrongFamily { .. }), "{e:?}");
    let mlp = "        Layer (type)               Output Shape         Param #\n\
               ================================================================\n\
                         Linear-1                  [-1, 100]          78,500\n\
                           ReLU-2                  [-1, 100]               0\n\
               ================================================================\n";
    parse_torchsummary(mlp, Family::Mlp, 8).unwrap();
    let e = parse_torchsummary(mlp, Family::Cnn, 8).unwrap_err();
    assert!(e.to_string().contains("no Conv2d"), "{e}");
}

#[test]
fn detailed_values_of_a_cifar_table() {
    use carma_estimator::reading::summary_values;
    let text = read("resnet18_cifar100.model");
    let (p, v) = summary_values(&text, Family::Cnn, 32, false).unwrap();
    // ReLU rows count half; the largest row is the stem's 64 × 16 × 16
    let relu: u64 = text
        .lines()
        .filter(|l| l.trim_start().starts_with("ReLU-"))
        .map(|l| {
            let shape = &l[l.find('[').unwrap() + 1..l.find(']').unwrap()];
            shape
                .split(',')
                .skip(1)
                .map(|d| d.trim().parse::<u64>().unwrap())
                .product::<u64>()
        })
        .sum();
    assert!(relu > 0);
    assert_eq!(v.saved, u128::from(p.activations - relu + relu.div_ceil(2)));
    assert_eq!(v.largest, 64 * 16 * 16);
    assert_eq!(v.scores, 0);
}
