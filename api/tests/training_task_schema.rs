//! The TrainingTask CRD describes `spec.template` as core/v1's PodTemplateSpec, so that the API
//! server refuses a malformed pod template and `kubectl explain` shows its fields; and the CRD
//! stays small enough for client-side `kubectl apply`.
//!
//! Objects are validated here the way `ci/checks/schemas.sh` does with check-jsonschema: the CRD's
//! openAPIV3Schema turned into a JSON Schema (nullable, x-kubernetes-int-or-string, and unknown
//! fields refused as under kubectl's default strict field validation).

use std::path::PathBuf;

use carma_api::TrainingTask;
use kube::CustomResourceExt;
use serde_json::{Value, json};

/// The API server's limit on all annotations of an object together (256 KiB). Client-side
/// `kubectl apply` keeps the whole object, as JSON, in its last-applied-configuration annotation,
/// so a CRD over this cannot be applied that way (CI's control-plane run applies the chart so).
const ANNOTATION_LIMIT_BYTES: usize = 262_144;

fn crd_json() -> Value {
    serde_json::to_value(TrainingTask::crd()).unwrap()
}

fn open_api_schema() -> Value {
    crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn template_schema() -> Value {
    open_api_schema()["properties"]["spec"]["properties"]["template"].clone()
}

#[test]
fn the_crd_fits_in_the_last_applied_configuration_annotation() {
    let bytes = serde_json::to_string(&TrainingTask::crd()).unwrap().len();
    eprintln!("the TrainingTask CRD: {bytes} bytes of JSON");
    // 169,538 bytes when written, 17,241 before the template had a schema; with PodTemplateSpec's
    // descriptions uncut it would be 342,591.
    assert!(
        bytes < ANNOTATION_LIMIT_BYTES,
        "the TrainingTask CRD is {bytes} bytes of JSON, over the {ANNOTATION_LIMIT_BYTES} bytes \
         kubectl apply's last-applied-configuration annotation may hold"
    );
}

#[test]
fn the_template_has_the_pod_fields() {
    let template = template_schema();
    assert_eq!(template["type"], "object");
    assert!(
        template
            .get("x-kubernetes-preserve-unknown-fields")
            .is_none(),
        "{template}"
    );
    let pod = &template["properties"]["spec"];
    assert_eq!(pod["type"], "object");
    assert_eq!(pod["required"], json!(["containers"]));
    let containers = &pod["properties"]["containers"];
    assert_eq!(containers["type"], "array");
    let container = &containers["items"];
    assert_eq!(container["type"], "object");
    assert_eq!(container["required"], json!(["name"]));
    for field in [
        "image",
        "command",
        "args",
        "env",
        "resources",
        "volumeMounts",
    ] {
        assert!(
            container["properties"][field]["description"].is_string(),
            "container.{field}: {}",
            container["properties"][field]
        );
    }
    let limits = &container["properties"]["resources"]["properties"]["limits"];
    assert_eq!(
        limits["additionalProperties"]["x-kubernetes-int-or-string"],
        true
    );
    // The metadata the operator copies to the attempt pods, and no more.
    let metadata = &template["properties"]["metadata"];
    assert_eq!(metadata["type"], "object");
    let fields: Vec<&String> = metadata["properties"].as_object().unwrap().keys().collect();
    assert_eq!(fields, ["annotations", "labels"]);
    for field in ["annotations", "labels"] {
        assert_eq!(
            metadata["properties"][field]["additionalProperties"],
            json!({"type": "string"})
        );
    }
}

/// What makes a schema structural for the API server, checked at every node of the CRD's schema:
/// a `type` wherever a value is specified (except int-or-string and preserved fields), no
/// references and no `oneOf`/`anyOf`/`allOf`/`not`, int-or-string without a type or preserved
/// fields, `metadata` an object.
#[test]
fn the_schema_is_structural() {
    fn walk(path: &str, node: &Value, int_or_string: &mut usize, errors: &mut Vec<String>) {
        let Some(map) = node.as_object() else {
            errors.push(format!("{path}: not a schema object"));
            return;
        };
        for key in [
            "$ref",
            "definitions",
            "$defs",
            "oneOf",
            "anyOf",
            "allOf",
            "not",
        ] {
            if map.contains_key(key) {
                errors.push(format!("{path}: {key}"));
            }
        }
        let is_int_or_string = map.get("x-kubernetes-int-or-string") == Some(&json!(true));
        let preserves = map.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
        if is_int_or_string {
            *int_or_string += 1;
            if map.contains_key("type") || preserves {
                errors.push(format!(
                    "{path}: int-or-string with a type or preserved fields"
                ));
            }
        } else if !preserves && !map.get("type").is_some_and(Value::is_string) {
            errors.push(format!("{path}: no type"));
        }
        if map.contains_key("properties") && map.get("type") != Some(&json!("object")) {
            errors.push(format!("{path}: properties of a non-object"));
        }
        if let Some(props) = map.get("properties").and_then(Value::as_object) {
            if let Some(metadata) = props.get("metadata")
                && metadata["type"] != "object"
            {
                errors.push(format!("{path}.metadata: not an object"));
            }
            for (name, child) in props {
                walk(&format!("{path}.{name}"), child, int_or_string, errors);
            }
        }
        if let Some(items) = map.get("items") {
            walk(&format!("{path}[]"), items, int_or_string, errors);
        }
        match map.get("additionalProperties") {
            Some(Value::Object(_)) => {
                let child = &map["additionalProperties"];
                walk(&format!("{path}{{}}"), child, int_or_string, errors);
            }
            Some(other) => errors.push(format!("{path}: additionalProperties {other}")),
            None => {}
        }
    }
    let mut int_or_string = 0;
    let mut errors = Vec::new();
    walk("", &open_api_schema(), &mut int_or_string, &mut errors);
    assert!(errors.is_empty(), "not structural: {errors:#?}");
    // Ports, quantities and probe thresholds of PodSpec are int-or-string.
    assert!(int_or_string >= 40, "{int_or_string} int-or-string fields");
}

/// The CRD's schema as a JSON Schema, as `ci/checks/lib/crd_to_jsonschema.py` converts it.
fn json_schema(node: &Value) -> Value {
    let Some(map) = node.as_object() else {
        return node.clone();
    };
    let mut out = serde_json::Map::new();
    for (key, value) in map {
        match key.as_str() {
            "properties" => {
                let props = value
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(name, child)| (name.clone(), json_schema(child)))
                    .collect();
                out.insert(key.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" => {
                out.insert(key.clone(), json_schema(value));
            }
            "nullable" => {}
            k if k.starts_with("x-kubernetes-") => {}
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    if map.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        out.remove("type");
        out.insert(
            "anyOf".into(),
            json!([{"type": "integer"}, {"type": "string"}]),
        );
    }
    if map.get("nullable") == Some(&json!(true))
        && let Some(Value::String(t)) = out.get("type").cloned()
    {
        out.insert("type".into(), json!([t, "null"]));
    }
    if map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && map.get("x-kubernetes-preserve-unknown-fields") != Some(&json!(true))
    {
        out.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(out)
}

fn validator() -> jsonschema::Validator {
    let mut schema = json_schema(&open_api_schema());
    schema["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    // The API server checks these itself, outside the CRD's schema.
    schema["properties"]["apiVersion"] = json!({"const": "carma.io/v1alpha1"});
    schema["properties"]["kind"] = json!({"const": "TrainingTask"});
    schema["properties"]["metadata"] = json!({
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}},
    });
    jsonschema::validator_for(&schema).expect("the CRD's schema is a valid JSON Schema")
}

/// Why `task` is refused, or None when it is valid.
fn refusal(validator: &jsonschema::Validator, task: &Value) -> Option<String> {
    let errors: Vec<String> = validator
        .iter_errors(task)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

fn task(template: Value) -> Value {
    json!({
        "apiVersion": "carma.io/v1alpha1",
        "kind": "TrainingTask",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"gpus": 1, "template": template},
    })
}

fn good_template() -> Value {
    json!({
        "metadata": {"labels": {"app": "train"}, "annotations": {"team": "vision"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "train",
                "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                "command": ["python", "train.py"],
                "env": [{"name": "EPOCHS", "value": "3"}],
                "ports": [{"containerPort": 8080}],
                "resources": {"requests": {"cpu": 2, "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
            }],
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    })
}

#[test]
fn a_well_formed_template_is_accepted() {
    let v = validator();
    let task = task(good_template());
    assert_eq!(refusal(&v, &task), None);
    // And it is what the operator reads.
    let typed: TrainingTask = serde_json::from_value(task).unwrap();
    assert_eq!(
        typed.spec.template.spec.unwrap().containers[0].name,
        "train"
    );
}

/// A change that breaks a well-formed template.
type Breakage = fn(&mut Value);

#[test]
fn a_malformed_template_is_refused() {
    let v = validator();
    let cases: [(&str, Breakage); 8] = [
        ("containers is a string", |t| {
            t["spec"]["containers"] = json!("oops")
        }),
        ("no containers", |t| {
            t["spec"].as_object_mut().unwrap().remove("containers");
        }),
        ("a misspelt field", |t| {
            t["spec"]["containers"][0]["imag"] = json!("pytorch")
        }),
        ("a container without a name", |t| {
            t["spec"]["containers"][0]
                .as_object_mut()
                .unwrap()
                .remove("name");
        }),
        ("a port as text", |t| {
            t["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("80")
        }),
        ("command as a string", |t| {
            t["spec"]["containers"][0]["command"] = json!("python train.py")
        }),
        ("a label that is a number", |t| {
            t["metadata"]["labels"]["replicas"] = json!(3)
        }),
        ("metadata the operator does not read", |t| {
            t["metadata"]["name"] = json!("mine")
        }),
    ];
    for (what, break_it) in cases {
        let mut template = good_template();
        break_it(&mut template);
        assert!(
            refusal(&v, &task(template.clone())).is_some(),
            "{what}: accepted {template}"
        );
    }
}

#[test]
fn every_example_training_task_validates() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let v = validator();
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let doc: Value = serde::Deserialize::deserialize(doc).unwrap();
            if doc["kind"] != "TrainingTask" {
                continue;
            }
            let name = format!("{}: {}", path.display(), doc["metadata"]["name"]);
            if let Some(why) = refusal(&v, &doc) {
                panic!("{name} is refused: {why}");
            }
            serde_json::from_value::<TrainingTask>(doc)
                .unwrap_or_else(|e| panic!("{name} does not read as a TrainingTask: {e}"));
            checked.push(name);
        }
    }
    assert!(checked.len() >= 3, "only {checked:?}");
}
