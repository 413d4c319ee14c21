//! The chart creates the PriorityClasses the operator names: its `files/queue-classes.yaml` is
//! what `carma queue-classes --chart-file` prints from carma-core's ladders.

use std::process::Command;

#[test]
fn the_charts_queue_classes_are_the_generated_ones() {
    let out = Command::new(env!("CARGO_BIN_EXE_carma"))
        .args(["queue-classes", "--chart-file"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/carma/files/queue-classes.yaml"
    );
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} differs from `carma queue-classes --chart-file`; regenerate it with \
         carma queue-classes --chart-file > charts/carma/files/queue-classes.yaml"
    );
    // Every order the operator accepts, but arrival, has its ladder in the file.
    for order in ["shortest-first:", "longest-first:", "short-then-longest:"] {
        assert!(generated.contains(&format!("\n{order}\n")), "{order}");
    }
}

#[test]
fn manifests_are_priority_classes_that_never_preempt() {
    let out = Command::new(env!("CARGO_BIN_EXE_carma"))
        .args(["queue-classes", "--queue-order", "short-then-longest:45"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    // Under 1, 2, 4, 8, 16, 32 and 45 min; then 9 doublings of 45 GPU-minutes.
    assert_eq!(docs.len(), 7 + 9, "{text}");
    for d in &docs {
        assert_eq!(d["kind"].as_str(), Some("PriorityClass"));
        assert_eq!(d["preemptionPolicy"].as_str(), Some("Never"));
        assert!(
            d["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("carma-queue-stl45-")
        );
    }
}
