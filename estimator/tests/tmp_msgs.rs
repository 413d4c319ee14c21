#[test]
fn show() {
    for j in [r#"{"family":"mlp","batchSize":"32","parameters":5,"activations":7,"depth":2}"#,
              r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2,"layers":{"lstm":1}}"#,
              r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2,"gpus":1}"#,
              r#"{"family":"gpu","batchSize":1,"parameters":5,"activations":7,"depth":2}"#,
              r#"{"batchSize":1,"parameters":5,"activations":7,"depth":2}"#,
              r#"[1,2]"#, "{", r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"layers":{"conv2d":-2}}"#] {
        println!("{}", carma_estimator::parse_profile(j).unwrap_err());
    }
}
