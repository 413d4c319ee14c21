//! `carma estimate`: a training job's GPU memory with GPUMemNet or
//! the analytic bound, an evaluation of the shipped model on a GPUMemNet CSV, or
//! carma's reservations against CARMA's measured peaks.
//!
//! ```text
//! carma estimate --profile job.json                      # `-` reads stdin
//! carma estimate --summary resnet18.txt --family cnn --batch-size 64
//! carma estimate --summary xlnet.txt --family transformer --batch-size 8 --seq-len 512
//! carma estimate eval --dataset ../shared/data/gpumemnet/mlp_data_step2.csv
//! carma estimate eval --peaks [--table]
//! ```
//!
//! `--summary` takes a torchsummary or torchinfo table, or an annotated module
//! printout (told apart by their headers and first line); `--optimizer` and `--mixed-precision` set the
//! profile's optional fields for either. Where a table or printout is read with the
//! layer-by-layer bound, the JSON's `terms` says what the reservation counts (context,
//! weights, gradients, optimizer state, activations, attention scores, step temporaries).
//! Every estimate's JSON has `source` and `warnings`: a table or printout that holds a module
//! type or an attention or sharing pattern the bound has no measured rule for is counted
//! conservatively, its source is `analytic-fallback` and `warnings` names what was unknown.
//! `--gpus` reads the job per GPU of a pod with that many GPUs (the bound's multi-GPU term);
//! `--shared-layer-runs` says how often a shared layer group (ALBERT's) runs.
//!
//! Output is JSON on stdout (a table with `eval --peaks --table`). Bad input (unreadable
//! file, malformed profile, summary or CSV) prints a message naming the problem on stderr and
//! exits 2.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use carma_estimator::analytic::detailed_bound_for;
use carma_estimator::reading::{printout_reading, summary_reading};
use carma_estimator::{
    Estimate, Estimator, Family, LayerReading, MAX_BATCH_SIZE, MAX_SEQ_LENGTH, Optimizer, Profile,
    evaluate, looks_like_printout, looks_like_torchinfo, parse_profile,
};
use carma_estimator_eval::{
    DEFAULT_PRINTOUTS, DEFAULT_SUMMARIES, DEFAULT_WORKLOADS, REPO_PRINTOUTS, REPO_SUMMARIES,
    REPO_TRACED, evaluate_measured, evaluate_peaks, render_table,
};
use serde_json::json;

use super::EXIT_BAD_INPUT;

/// Arguments of `carma estimate`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct EstimateArgs {
    /// The `carma.io/model-profile` JSON of the job (`-` reads stdin).
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "summary",
        conflicts_with = "summary"
    )]
    pub profile: Option<PathBuf>,
    /// A `torchsummary` or `torchinfo` table, or a PyTorch module printout annotated with
    /// `, <n> params` per module (transformers; needs `--seq-len`), of the job's
    /// model (`-` reads stdin); needs `--family` and `--batch-size`.
    #[arg(long, value_name = "FILE", requires_all = ["family", "batch_size"])]
    pub summary: Option<PathBuf>,
    /// Model family of the `--summary` table: mlp, cnn or transformer.
    #[arg(long, requires = "summary")]
    pub family: Option<Family>,
    /// Training batch size for the `--summary` table (1 to 1048576).
    #[arg(long, requires = "summary",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_SIZE)))]
    pub batch_size: Option<u32>,
    /// Tokens per sample for a transformer `--summary` (1 to 1048576); required
    /// for a module printout.
    #[arg(long, requires = "summary",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SEQ_LENGTH)))]
    pub seq_len: Option<u32>,
    /// Optimizer of a `--summary` job: sgd, sgdMomentum or adam (default adam).
    #[arg(long, requires = "summary", value_parser = parse_optimizer)]
    pub optimizer: Option<Optimizer>,
    /// The `--summary` job trains with mixed precision (16-bit activations).
    #[arg(long, requires = "summary")]
    pub mixed_precision: bool,
    /// GPUs per pod of the job (1 to 64, default 1): the reservation is per GPU, and a table's or
    /// printout's bound adds what each GPU beyond the first holds. `--batch-size` is then the
    /// per-GPU batch.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus: Option<u32>,
    /// How many times a shared layer group of a `--summary` printout runs (ALBERT's
    /// `num_hidden_layers`, 1 to 1024); without it such a group counts 24 runs and the estimate
    /// is a fallback.
    #[arg(long, requires = "summary", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shared_layer_runs: Option<u32>,
    /// Print the job's model profile (with the table's or printout's `layerReading`) instead
    /// of the estimate: a `carma.io/model-profile` annotation or a TrainingTask's
    /// `modelProfile` that makes the cluster reserve what this command estimates.
    #[arg(long, requires = "summary")]
    pub emit_profile: bool,
    /// Evaluate the shipped model instead of estimating one job.
    #[command(subcommand)]
    pub action: Option<EstimateAction>,
}

/// Subcommands of `carma estimate`.
#[derive(Debug, clap::Subcommand)]
pub enum EstimateAction {
    /// Evaluate the shipped MLP model on a CSV in GPUMemNet's schema (step 1 or 2),
    /// or (`--peaks`) carma's reservations against CARMA's measured peaks.
    Eval {
        /// The CSV file.
        #[arg(long, value_name = "FILE.csv", required_unless_present = "peaks")]
        dataset: Option<PathBuf>,
        /// Compare carma's reservation, the legacy (uncalibrated) analytic bound and
        /// GPUMemNet's recorded estimate with the peaks in CARMA's task files.
        #[arg(long, conflicts_with = "dataset")]
        peaks: bool,
        /// CARMA's `.rad` task files (with `--peaks`).
        #[arg(long, value_name = "DIR", default_value = DEFAULT_WORKLOADS)]
        workloads: PathBuf,
        /// torchsummary tables named on the task files' line 3, or that name without its
        /// `_<batch>` suffix (with `--peaks`; repeat for several folders, the first
        /// holding a file wins).
        #[arg(long, value_name = "DIR", default_values = [DEFAULT_SUMMARIES, REPO_SUMMARIES])]
        summaries: Vec<PathBuf>,
        /// Module printouts `<model>_bs<B>_sl<L>.txt` (with `--peaks`; repeatable).
        #[arg(long, value_name = "DIR", default_values = [DEFAULT_PRINTOUTS, REPO_PRINTOUTS])]
        printouts: Vec<PathBuf>,
        /// The traced step of each job, CSV (with `--peaks`; the `traced` source is not run
        /// when the file does not exist).
        #[arg(long, value_name = "FILE.csv", default_value = REPO_TRACED)]
        traced: PathBuf,
        /// Print a text table with summary lines instead of JSON (with `--peaks`).
        #[arg(long)]
        table: bool,
    },
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    match s
        .trim()
        .to_ascii_lowercase()
        .replace(['-', '_'], "")
        .as_str()
    {
        "sgd" => Ok(Optimizer::Sgd),
        "sgdmomentum" | "momentum" => Ok(Optimizer::SgdMomentum),
        "adam" | "adamw" => Ok(Optimizer::Adam),
        _ => Err(format!("`{s}` is not sgd, sgdMomentum or adam")),
    }
}

/// What `execute` produced: JSON, or text for `eval --peaks --table`.
#[derive(Debug)]
enum Output {
    Json(serde_json::Value),
    Text(String),
}

/// Input the user got wrong: reported with exit code 2.
#[derive(Debug)]
struct BadInput(String);

/// Run `carma estimate`.
pub fn run(args: EstimateArgs) -> anyhow::Result<ExitCode> {
    let estimator = Estimator::new().context("loading the embedded GPUMemNet models")?;
    match execute(&estimator, &args) {
        Ok(out) => {
            let text = match out {
                Output::Json(v) => serde_json::to_string_pretty(&v)?,
                Output::Text(t) => t.trim_end().to_string(),
            };
            outln!("{text}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(BadInput(message)) => {
            eprintln!("carma estimate: {message}");
            Ok(ExitCode::from(EXIT_BAD_INPUT))
        }
    }
}

fn execute(estimator: &Estimator, args: &EstimateArgs) -> Result<Output, BadInput> {
    if let Some(EstimateAction::Eval {
        dataset,
        peaks,
        workloads,
        summaries,
        printouts,
        traced,
        table,
    }) = &args.action
    {
        if *table && !*peaks {
            return Err(BadInput("--table goes with --peaks".into()));
        }
        if *peaks {
            let mut report = evaluate_peaks(estimator, workloads, summaries, printouts, traced)
                .map_err(|e| BadInput(e.to_string()))?;
            // carma's own GPU measurements live beside the traced CSV
            let data = traced.parent().unwrap_or(Path::new("."));
            report.measured = evaluate_measured(data).map_err(|e| BadInput(e.to_string()))?;
            if *table {
                return Ok(Output::Text(render_table(&report)));
            }
            let out = serde_json::to_value(&report).map_err(|e| BadInput(e.to_string()))?;
            return Ok(Output::Json(out));
        }
        let dataset = dataset
            .as_ref()
            .ok_or_else(|| BadInput("eval needs --dataset FILE.csv or --peaks".into()))?;
        let eval = evaluate(estimator, dataset)
            .map_err(|e| BadInput(format!("{}: {e}", dataset.display())))?;
        let mut out = serde_json::to_value(&eval).map_err(|e| BadInput(e.to_string()))?;
        out["dataset"] = json!(dataset.display().to_string());
        return Ok(Output::Json(out));
    }
    let profile = read_profile(args)?;
    if args.emit_profile {
        // The profile carries the caveats (`caveats`), and the cluster's estimate says them;
        // say them here too, for the person who writes the annotation.
        for c in &profile.caveats {
            eprintln!("carma estimate: warning: {c}");
        }
        let out = serde_json::to_value(&profile).map_err(|e| BadInput(e.to_string()))?;
        return Ok(Output::Json(out));
    }
    // A table or printout carries its layer-by-layer reading: where the analytic bound is
    // used, the estimator reads it, and the answer says what it counts.
    let gpus = args.gpus.unwrap_or(1);
    let estimate = estimator
        .estimate_for(&profile, gpus)
        .map_err(|e| BadInput(e.to_string()))?;
    let mut out = render(&estimate);
    if let Some(reading) = &profile.layer_reading
        && estimate.source.is_analytic()
    {
        let terms = detailed_bound_for(&profile, &reading.values(), gpus);
        out["terms"] = serde_json::to_value(terms).map_err(|e| BadInput(e.to_string()))?;
    }
    Ok(Output::Json(out))
}

/// The job's profile; from a table or a printout, with its layer-by-layer reading and what that
/// reading had no rule for (`caveats`).
fn read_profile(args: &EstimateArgs) -> Result<Profile, BadInput> {
    match (&args.profile, &args.summary, args.family, args.batch_size) {
        (Some(path), None, _, _) => {
            let text = read_input(path)?;
            let profile =
                parse_profile(&text).map_err(|e| BadInput(format!("{}: {e}", path.display())))?;
            Ok(profile)
        }
        (None, Some(path), Some(family), Some(batch)) => {
            let text = read_input(path)?;
            let at = |e: &dyn std::fmt::Display| BadInput(format!("{}: {e}", path.display()));
            let mut reading = if looks_like_printout(&text) {
                let seq = args
                    .seq_len
                    .ok_or_else(|| at(&"a module printout needs --seq-len (tokens per sample)"))?;
                printout_reading(&text, family, batch, seq, args.shared_layer_runs)
                    .map_err(|e| at(&e))?
            } else {
                if args.shared_layer_runs.is_some() {
                    return Err(at(&"--shared-layer-runs goes with a module printout"));
                }
                let mut r = summary_reading(&text, family, batch, looks_like_torchinfo(&text))
                    .map_err(|e| at(&e))?;
                r.profile.seq_length = args.seq_len;
                r
            };
            let profile = &mut reading.profile;
            profile.optimizer = args.optimizer;
            profile.mixed_precision = args.mixed_precision.then_some(true);
            profile.layer_reading = Some(LayerReading::from(&reading.values));
            profile.caveats = reading.caveats;
            profile.validate().map_err(|e| at(&e))?;
            Ok(reading.profile)
        }
        (None, Some(_), _, _) => Err(BadInput("--summary needs --family and --batch-size".into())),
        _ => Err(BadInput(
            "give --profile FILE, or --summary FILE --family F --batch-size N".into(),
        )),
    }
}

fn read_input(path: &Path) -> Result<String, BadInput> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| BadInput(format!("cannot read stdin: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(path)
        .map_err(|e| BadInput(format!("cannot read {}: {e}", path.display())))
}

/// The JSON printed for one estimate (`warnings` always, empty when the reading had a rule for
/// everything).
fn render(e: &Estimate) -> serde_json::Value {
    json!({
        "estimate_mib": e.mib,
        "class": e.class,
        "source": e.source,
        "warnings": e.warnings,
        "probabilities": e.probabilities,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: EstimateArgs,
    }

    fn parse(argv: &[&str]) -> Result<EstimateArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("estimate").chain(argv.iter().copied())).map(|c| c.args)
    }

    fn json(out: Output) -> serde_json::Value {
        match out {
            Output::Json(v) => v,
            Output::Text(t) => panic!("expected JSON, got text:\n{t}"),
        }
    }

    fn temp(content: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), content).unwrap();
        f
    }

    #[test]
    fn flags_are_validated_by_clap() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--profile", "a", "--summary", "b"]).is_err());
        assert!(parse(&["--summary", "b"]).is_err());
        assert!(parse(&["--summary", "b", "--family", "cnn"]).is_err());
        assert!(parse(&["--summary", "b", "--family", "gpu", "--batch-size", "1"]).is_err());
        assert!(parse(&["--profile", "a", "--batch-size", "1"]).is_err());
        assert!(parse(&["--profile", "a", "eval", "--dataset", "x"]).is_err());
        // Out of range (zero, u32::MAX, one past the limit) is a usage error naming the flag and
        // the range, not an absurd estimate with exit 0.
        for bad in ["0", "4294967295", "1048577"] {
            let e = parse(&["--summary", "b", "--family", "cnn", "--batch-size", bad]).unwrap_err();
            assert_eq!(e.exit_code(), i32::from(EXIT_BAD_INPUT));
            let msg = e.to_string();
            assert!(
                msg.contains("--batch-size") && msg.contains("1..=1048576"),
                "{msg}"
            );
        }
        let a = parse(&["--summary", "b", "--family", "cnn", "--batch-size", "8"]).unwrap();
        assert_eq!((a.family, a.batch_size), (Some(Family::Cnn), Some(8)));
        assert!(matches!(
            parse(&["eval", "--dataset", "x.csv"]).unwrap().action,
            Some(EstimateAction::Eval { .. })
        ));
        assert!(parse(&["eval"]).is_err());
        assert!(parse(&["eval", "--dataset", "x.csv", "--peaks"]).is_err());
        assert!(parse(&["eval", "--peaks", "--table"]).is_ok());
        assert!(parse(&["--profile", "a", "--seq-len", "8"]).is_err());
        let a = parse(&[
            "--summary",
            "b",
            "--family",
            "transformer",
            "--batch-size",
            "8",
            "--seq-len",
            "512",
            "--optimizer",
            "sgd-momentum",
            "--mixed-precision",
        ])
        .unwrap();
        assert_eq!(a.optimizer, Some(Optimizer::SgdMomentum));
        assert!(a.mixed_precision && a.seq_len == Some(512));
        assert!(
            parse(&[
                "--summary",
                "b",
                "--family",
                "cnn",
                "--batch-size",
                "8",
                "--optimizer",
                "lbfgs"
            ])
            .is_err()
        );
        // a parse error exits 2 as well (clap's usage-error code)
        assert_eq!(
            parse(&[]).unwrap_err().exit_code(),
            i32::from(EXIT_BAD_INPUT)
        );
    }

    #[test]
    fn profile_estimate_prints_the_documented_keys() {
        let est = Estimator::new().unwrap();
        let f = temp(
            r#"{"family":"mlp","batchSize":64,"parameters":100000,"activations":2000,"depth":3}"#,
        );
        let out = json(
            execute(
                &est,
                &parse(&["--profile", f.path().to_str().unwrap()]).unwrap(),
            )
            .unwrap(),
        );
        assert_eq!(out["estimate_mib"], 2000);
        assert_eq!(out["class"], "(1000,2000]");
        assert_eq!(out["source"], "gpumemnet-mlp");
        assert_eq!(out["warnings"], json!([]));
        assert_eq!(out["probabilities"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn summary_estimate_uses_the_analytic_bound_for_cnn() {
        let est = Estimator::new().unwrap();
        let f = temp(
            "Layer (type)   Output Shape   Param #\n====\nConv2d-1  [-1, 32, 26, 26]  320\nLinear-2  [-1, 10]  1,290\n====\nTotal params: 1,610\n",
        );
        let args = parse(&[
            "--summary",
            f.path().to_str().unwrap(),
            "--family",
            "cnn",
            "--batch-size",
            "32",
        ])
        .unwrap();
        let out = json(execute(&est, &args).unwrap());
        assert_eq!(out["source"], "analytic-upper-bound");
        assert!(out["estimate_mib"].as_u64().unwrap() >= 1536);
        // what the reservation counts, term by term; the terms add up to at most the total,
        // which is their sum rounded up
        let terms = out["terms"].as_object().unwrap();
        assert_eq!(terms["total_mib"], out["estimate_mib"]);
        assert_eq!(terms["context_mib"], 1536);
        let sum: u64 = terms
            .iter()
            .filter(|(k, _)| *k != "total_mib")
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert!(
            sum <= out["estimate_mib"].as_u64().unwrap() && sum > 1536,
            "{out}"
        );
    }

    #[test]
    fn an_emitted_profile_reserves_what_the_summary_estimates() {
        let est = Estimator::new().unwrap();
        let f = temp(
            "Layer (type)   Output Shape   Param #\n====\nConv2d-1  [-1, 32, 26, 26]  320\nLinear-2  [-1, 10]  1,290\n====\nTotal params: 1,610\n",
        );
        let path = f.path().to_str().unwrap();
        let flags = ["--summary", path, "--family", "cnn", "--batch-size", "512"];
        let direct = json(execute(&est, &parse(&flags).unwrap()).unwrap());
        let emitted = json(
            execute(
                &est,
                &parse(&[flags.as_slice(), &["--emit-profile"]].concat()).unwrap(),
            )
            .unwrap(),
        );
        assert!(emitted["layerReading"]["savedValues"].as_u64().unwrap() > 0);
        let p = temp(&emitted.to_string());
        let from_profile = json(
            execute(
                &est,
                &parse(&["--profile", p.path().to_str().unwrap()]).unwrap(),
            )
            .unwrap(),
        );
        assert_eq!(from_profile, direct);
        assert!(parse(&["--profile", "x", "--emit-profile"]).is_err());
    }

    #[test]
    fn bad_input_is_reported() {
        let est = Estimator::new().unwrap();
        let f = temp(
            r#"{"family":"mlp","batchSize":64,"parameters":1,"activations":2,"depth":3,"gpu":1}"#,
        );
        let BadInput(msg) = execute(
            &est,
            &parse(&["--profile", f.path().to_str().unwrap()]).unwrap(),
        )
        .unwrap_err();
        assert!(msg.contains("`gpu`"), "{msg}");
        let BadInput(msg) =
            execute(&est, &parse(&["--profile", "/nonexistent/p.json"]).unwrap()).unwrap_err();
        assert!(msg.contains("cannot read"), "{msg}");
        let f = temp("not a table");
        let args = parse(&[
            "--summary",
            f.path().to_str().unwrap(),
            "--family",
            "cnn",
            "--batch-size",
            "1",
        ])
        .unwrap();
        assert!(execute(&est, &args).unwrap_err().0.contains("torchsummary"));
        let f = temp("Depth,Batch Size\n1,2\n");
        let BadInput(msg) = execute(
            &est,
            &parse(&["eval", "--dataset", f.path().to_str().unwrap()]).unwrap(),
        )
        .unwrap_err();
        assert!(msg.contains("Total Parameters"), "{msg}");
    }

    #[test]
    fn eval_prints_the_documented_keys() {
        let est = Estimator::new().unwrap();
        let f = temp(
            "Depth,Activation Function,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB)\n3,ReLU,2000,100000,64,1600\n5,GELU,30000,40000000,900,3500\n",
        );
        let out = json(
            execute(
                &est,
                &parse(&["eval", "--dataset", f.path().to_str().unwrap()]).unwrap(),
            )
            .unwrap(),
        );
        for key in [
            "rows",
            "accuracy",
            "underestimate_rate",
            "per_class_recall",
            "mean_over_reservation_mib",
        ] {
            assert!(out.get(key).is_some(), "missing {key}: {out}");
        }
        assert_eq!(out["rows"], 2);
    }
}

#[cfg(test)]
mod printout_tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: EstimateArgs,
    }

    fn run_with(argv: &[&str]) -> Result<serde_json::Value, BadInput> {
        let args = Cli::try_parse_from(std::iter::once("estimate").chain(argv.iter().copied()))
            .unwrap()
            .args;
        match execute(&Estimator::new().unwrap(), &args)? {
            Output::Json(v) => Ok(v),
            Output::Text(t) => panic!("{t}"),
        }
    }

    fn xlnet() -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/model-printouts/xlnet_base_cased_bs8_sl512.txt");
        assert!(
            p.is_file(),
            "shared data not found: {} (the read-only ../shared next to the repository)",
            p.display()
        );
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn printout_summary_is_estimated_with_the_documented_keys() {
        let path = xlnet();
        let base = [
            "--summary",
            &path,
            "--family",
            "transformer",
            "--batch-size",
            "8",
        ];
        let BadInput(msg) = run_with(&base).unwrap_err();
        assert!(msg.contains("--seq-len"), "{msg}");
        let out = run_with(&[&base[..], &["--seq-len", "512"]].concat()).unwrap();
        assert_eq!(out["source"], "analytic-upper-bound");
        let mib = out["estimate_mib"].as_u64().unwrap();
        // measured 9,192 MiB per GPU in CARMA's v2 profile
        assert!((9192..16_000).contains(&mib), "{out}");
        let lean = run_with(
            &[
                &base[..],
                &[
                    "--seq-len",
                    "512",
                    "--optimizer",
                    "sgd",
                    "--mixed-precision",
                ],
            ]
            .concat(),
        )
        .unwrap();
        assert!(lean["estimate_mib"].as_u64().unwrap() < mib, "{lean}");
        let BadInput(msg) = run_with(&[
            "--summary",
            &path,
            "--family",
            "cnn",
            "--batch-size",
            "8",
            "--seq-len",
            "512",
        ])
        .unwrap_err();
        assert!(msg.contains("transformer family only"), "{msg}");
    }

    fn repo_file(rel: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
        assert!(p.is_file(), "{}", p.display());
        p.to_string_lossy().into_owned()
    }

    /// XLNet-large as CARMA ran it (v2 xlnet_large_cased_2.rad: batch 8 over 2 GPUs, 4 per GPU)
    /// peaked at 19,330 MiB per GPU. One GPU's reading is below that; the job's GPU count covers it.
    #[test]
    fn xlnet_large_on_its_two_gpus_covers_the_measured_peak() {
        let path =
            repo_file("estimator/tests/data/model-printouts/xlnet_large_cased_bs8_sl512.txt");
        let base = [
            "--summary",
            &path,
            "--family",
            "transformer",
            "--batch-size",
            "4",
            "--seq-len",
            "512",
        ];
        let one = run_with(&base).unwrap();
        let two = run_with(&[&base[..], &["--gpus", "2"]].concat()).unwrap();
        let mib = |v: &serde_json::Value| v["estimate_mib"].as_u64().unwrap();
        assert!(mib(&one) < 19_330, "{one}");
        assert!(mib(&two) >= 19_330, "{two}");
        assert_eq!(
            two["terms"]["multi_gpu_mib"],
            carma_estimator::MULTI_GPU_MIB,
            "{two}"
        );
        assert_eq!(two["terms"]["total_mib"], two["estimate_mib"]);
        for out in [&one, &two] {
            assert_eq!(out["source"], "analytic-upper-bound");
            assert_eq!(out["warnings"], json!([]));
        }
    }

    #[test]
    fn a_fallback_says_so_and_why() {
        let albert = repo_file("estimator/tests/data/held-out/albert_base_mlm_bs16_sl512.txt");
        let base = [
            "--summary",
            &albert,
            "--family",
            "transformer",
            "--batch-size",
            "16",
            "--seq-len",
            "512",
        ];
        // ALBERT's shared layer group, run count not given: the most runs of its configurations
        let assumed = run_with(&base).unwrap();
        assert_eq!(assumed["source"], "analytic-fallback");
        let warnings = assumed["warnings"].as_array().unwrap();
        assert_eq!(warnings.len(), 1, "{assumed}");
        assert!(
            warnings[0]
                .as_str()
                .unwrap()
                .starts_with("shared-layers: AlbertLayerGroup"),
            "{assumed}"
        );
        // given: the measured rule, no warning, and a smaller reservation
        let told = run_with(&[&base[..], &["--shared-layer-runs", "12"]].concat()).unwrap();
        assert_eq!(told["source"], "analytic-upper-bound");
        assert_eq!(told["warnings"], json!([]));
        assert!(told["estimate_mib"].as_u64().unwrap() < assumed["estimate_mib"].as_u64().unwrap());
        // an attention block of a type no rule knows
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            "Net(\n  (emb): Embedding(100, 128), 12,800 params\n  (attn): MysteryAttention(\n    \
             (o): Linear(in_features=128, out_features=128, bias=False), 16,384 params\n  ), \
             16,384 params\n), 29,184 params\n",
        )
        .unwrap();
        let path = f.path().to_string_lossy().into_owned();
        let out = run_with(&[
            "--summary",
            &path,
            "--family",
            "transformer",
            "--batch-size",
            "8",
            "--seq-len",
            "512",
        ])
        .unwrap();
        assert_eq!(out["source"], "analytic-fallback");
        assert!(
            out["warnings"][0]
                .as_str()
                .unwrap()
                .starts_with("unknown-attention: MysteryAttention"),
            "{out}"
        );
        assert!(out["terms"]["scores_mib"].as_u64().unwrap() > 0, "{out}");
        // the flag goes with a printout
        let BadInput(msg) = run_with(&[
            "--summary",
            &repo_file("estimator/tests/data/model-summaries/vgg.model"),
            "--family",
            "cnn",
            "--batch-size",
            "8",
            "--shared-layer-runs",
            "2",
        ])
        .unwrap_err();
        assert!(msg.contains("--shared-layer-runs"), "{msg}");
    }

    /// An MLP table with an attention row of no known kind: the reading counts every value
    /// conservatively, but where GPUMemNet's class reserves more than that bound, the class sets
    /// the reservation and the estimate is no fallback.
    #[test]
    fn a_caveat_marks_a_fallback_only_where_the_fallback_sets_the_reservation() {
        let table = |attention: &str| {
            format!(
                "Layer (type)   Output Shape   Param #\n====\n\
                 Linear-1  [-1, 512]  401,920\nReLU-2  [-1, 512]  0\n\
                 {attention}-3  [-1, 512]  0\nLinear-4  [-1, 10]  5,130\n\
                 ====\nTotal params: 407,050\n"
            )
        };
        let mystery = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(mystery.path(), table("MysteryAttention")).unwrap();
        let known = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(known.path(), table("MultiheadAttention")).unwrap();
        let at = |f: &tempfile::NamedTempFile, batch: &str| {
            let path = f.path().to_string_lossy().into_owned();
            run_with(&["--summary", &path, "--family", "mlp", "--batch-size", batch]).unwrap()
        };
        // batch 64: within the model's range, its class (1000,2000] is above the bound
        let a = at(&mystery, "64");
        assert_eq!(a["source"], "gpumemnet-mlp", "{a}");
        assert_eq!(a["warnings"], json!([]), "{a}");
        assert_eq!(a["estimate_mib"], at(&known, "64")["estimate_mib"]);
        // batch 4096: beyond the model's range; the class edge (3,000) is above the bound too
        let b = at(&mystery, "4096");
        assert_eq!(b["source"], "analytic-upper-bound", "{b}");
        assert_eq!(b["warnings"], json!([]), "{b}");
        assert_eq!(b["estimate_mib"], at(&known, "4096")["estimate_mib"]);
        // the emitted profile carries the caveat, and the estimate from it says the same
        let path = mystery.path().to_string_lossy().into_owned();
        let flags = ["--summary", &path, "--family", "mlp", "--batch-size", "64"];
        let emitted = run_with(&[flags.as_slice(), &["--emit-profile"]].concat()).unwrap();
        assert_eq!(
            emitted["caveats"][0]["kind"], "unknown-attention",
            "{emitted}"
        );
        let p = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(p.path(), emitted.to_string()).unwrap();
        let from_profile = run_with(&["--profile", p.path().to_str().unwrap()]).unwrap();
        assert_eq!(from_profile, a);
    }

    #[test]
    fn torchinfo_tables_are_read() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            "Layer (type:depth-idx)   Output Shape   Param #\n====\nNet  [4, 10]  --\n├─Conv2d: 1-1  [4, 8, 6, 6]  80\n├─Linear: 1-2  [4, 10]  2,890\n====\nTotal params: 2,970\n",
        )
        .unwrap();
        let path = f.path().to_string_lossy().into_owned();
        let out = run_with(&["--summary", &path, "--family", "cnn", "--batch-size", "4"]).unwrap();
        assert_eq!(out["source"], "analytic-upper-bound");
        assert!(out["estimate_mib"].as_u64().unwrap() >= 1536);
    }

    #[test]
    fn eval_peaks_prints_rows_and_tallies() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dirs = [DEFAULT_WORKLOADS, DEFAULT_SUMMARIES, DEFAULT_PRINTOUTS].map(|d| {
            let p = root.join(d);
            assert!(p.is_dir(), "shared data not found: {}", p.display());
            p.to_string_lossy().into_owned()
        });
        let eval = [
            "eval",
            "--peaks",
            "--workloads",
            &dirs[0],
            "--summaries",
            &dirs[1],
            "--printouts",
            &dirs[2],
        ];
        let out = run_with(&eval).unwrap();
        for key in [
            "rows",
            "carma",
            "legacy",
            "gpumemnet",
            "carma_where_gpumemnet",
        ] {
            assert!(out.get(key).is_some(), "missing {key}");
        }
        assert_eq!(out["carma"]["underestimates"], 0);
        // `--table`: the text docs/estimator-evaluation.md quotes.
        let argv = ["estimate"].into_iter().chain(eval).chain(["--table"]);
        let args = Cli::try_parse_from(argv).unwrap().args;
        match execute(&Estimator::new().unwrap(), &args).unwrap() {
            Output::Text(t) => assert!(
                t.contains("carma (all rows): 53 rows, 0 underestimates"),
                "{t}"
            ),
            Output::Json(v) => panic!("expected the table, got {v}"),
        }
    }
}
