//! `carma queue-classes`: the PriorityClasses through which kube-scheduler applies a queue order.

use std::process::ExitCode;

use carma_core::{QueueClass, QueueOrder};
use serde_json::{Value, json};

/// Arguments of `carma queue-classes`.
#[derive(Debug, clap::Args)]
pub struct QueueClassesArgs {
    /// The order whose classes to print: shortest-first, longest-first or
    /// `short-then-longest[:MINUTES]` (the operator's --queue-order; arrival needs none).
    #[arg(long, default_value = "short-then-longest", value_parser = |s: &str| s.parse::<QueueOrder>())]
    pub queue_order: QueueOrder,
    /// Print every order's ladder at its default threshold as the chart's
    /// `files/queue-classes.yaml` instead of PriorityClass objects.
    #[arg(long)]
    pub chart_file: bool,
}

/// The header of the chart's copy (`cli/tests/queue_classes.rs` holds the copy equal to the output).
const CHART_FILE_HEADER: &str = "# Generated; do not edit: carma queue-classes --chart-file > charts/carma/files/queue-classes.yaml\n\
# The PriorityClasses of each queue order, highest value first; templates/queueclasses.yaml\n\
# creates those of the order the operator runs with (queueOrder.order).\n";

fn class_json(c: &QueueClass) -> Value {
    json!({"name": c.name, "value": c.value, "description": c.description})
}

/// The chart's `files/queue-classes.yaml`: every order with classes, by its name.
pub fn chart_file() -> anyhow::Result<String> {
    let mut ladders = serde_json::Map::new();
    for order in QueueOrder::ALL {
        let classes = order.classes();
        if !classes.is_empty() {
            ladders.insert(
                order.as_str().to_string(),
                classes.iter().map(class_json).collect(),
            );
        }
    }
    Ok(format!(
        "{CHART_FILE_HEADER}{}",
        serde_yaml_ng::to_string(&Value::Object(ladders))?
    ))
}

/// PriorityClass objects for `order`, as a YAML stream for `kubectl apply -f -`.
pub fn manifests(order: QueueOrder) -> anyhow::Result<String> {
    let mut out = String::new();
    for c in order.classes() {
        let pc = json!({
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {
                "name": c.name,
                "labels": {"app.kubernetes.io/part-of": "carma"},
            },
            "value": c.value,
            "globalDefault": false,
            "preemptionPolicy": "Never",
            "description": c.description,
        });
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&pc)?);
    }
    Ok(out)
}

/// Run `carma queue-classes`.
pub fn run(args: QueueClassesArgs) -> anyhow::Result<ExitCode> {
    if args.chart_file {
        out!("{}", chart_file()?)?;
    } else if args.queue_order == QueueOrder::Arrival {
        eprintln!(
            "carma queue-classes: arrival order gives every pod the same priority; it needs no classes"
        );
    } else {
        out!("{}", manifests(args.queue_order)?)?;
    }
    Ok(ExitCode::SUCCESS)
}
