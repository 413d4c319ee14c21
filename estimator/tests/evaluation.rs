//! The Rust evaluation of the shipped model reproduces the figures the training
//! pipeline wrote into the sidecar (and the model card).

mod common;

use carma_estimator::{Estimator, analytic_upper_bound_mib, evaluate, read_mlp_csv};

fn check_file(name: &str) {
    let path = common::shared_file(&format!("gpumemnet/{name}"));
    let est = Estimator::new().expect("embedded model loads");
    let eval = evaluate(&est, &path).expect("evaluation runs");
    let card = &common::sidecar()["shipped"][name];
    assert!(
        card.is_object(),
        "sidecar has no shipped figures for {name}"
    );

    let rows = card["rows"].as_u64().unwrap();
    assert_eq!(eval.rows, rows, "{name}: rows");
    // tract and onnxruntime agree to ~1e-6; a row whose cumulative probability
    // sits exactly at the threshold could flip, so allow one row of slack.
    let one_row = 1.0 / rows as f64 + 1e-12;
    let acc = card["accuracy"].as_f64().unwrap();
    assert!(
        (eval.accuracy - acc).abs() <= one_row,
        "{name}: accuracy {} vs card {acc}",
        eval.accuracy
    );
    let under = card["underestimate_rate"].as_f64().unwrap();
    assert!(
        (eval.underestimate_rate - under).abs() <= one_row,
        "{name}: underestimate rate {} vs card {under}",
        eval.underestimate_rate
    );
    let over = card["mean_over_reservation_mib"].as_f64().unwrap();
    assert!(
        (eval.mean_over_reservation_mib - over).abs() <= 1000.0 / rows as f64 + 1e-9,
        "{name}: mean over-reservation {} vs card {over}",
        eval.mean_over_reservation_mib
    );
    let recalls = card["per_class_recall"].as_array().unwrap();
    assert_eq!(eval.per_class_recall.len(), recalls.len());
    for (r, c) in eval.per_class_recall.iter().zip(recalls) {
        match (r.recall, c.as_f64()) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert!(
                    (a - b).abs() <= 1.0 / r.rows as f64 + 1e-12,
                    "{name}: recall of {} {a} vs {b}",
                    r.class
                )
            }
            other => panic!("{name}: recall of {} differs: {other:?}", r.class),
        }
    }
    assert_eq!(
        eval.analytic_rows, 0,
        "{name}: training rows must stay within the training range"
    );
    // the goal: beat GPUMemNet's best underestimation rate (0.76 %, its paper's Transformer ensemble)
    assert!(
        eval.underestimate_rate < 0.0076,
        "{name}: {}",
        eval.underestimate_rate
    );
}

#[test]
fn step1_figures_match_the_model_card() {
    check_file("mlp_data_step1.csv");
}

#[test]
fn step2_figures_match_the_model_card() {
    check_file("mlp_data_step2.csv");
}

#[test]
fn cross_validated_figures_meet_the_goal() {
    let cv = &common::sidecar()["cv"];
    // GPUMemNet's best MLP-data figures: 98.38 % accuracy, 0.76 % underestimates.
    assert!(cv["accuracy_mean"].as_f64().unwrap() > 0.98, "{cv}");
    assert!(
        cv["underestimate_rate_mean"].as_f64().unwrap() < 0.0076,
        "{cv}"
    );
}

#[test]
fn analytic_bound_covers_every_measured_run() {
    for name in ["mlp_data_step1.csv", "mlp_data_step2.csv"] {
        let text =
            std::fs::read_to_string(common::shared_file(&format!("gpumemnet/{name}"))).unwrap();
        let rows = read_mlp_csv(&text).unwrap();
        for r in &rows {
            // the MLP family's constants, fp32 and Adam (GPUMemNet's runs)
            let bound = analytic_upper_bound_mib(&r.profile) as f64;
            assert!(
                bound >= r.measured_mib,
                "{name} line {}: bound {bound} < measured {}",
                r.line,
                r.measured_mib
            );
        }
    }
}
