//! `crds/` must hold exactly what the code generates (`carma crds --out-dir crds`).
//! Run with `CARMA_UPDATE_CRDS=1` to rewrite the files after changing the types.

use std::path::PathBuf;

#[test]
fn crds_directory_matches_the_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let update = std::env::var_os("CARMA_UPDATE_CRDS").is_some();
    let mut drifted = Vec::new();
    for (file, crd) in carma_api::crds::all() {
        let path = dir.join(file);
        let want = carma_api::crds::to_yaml(&crd).expect("CRD serialises");
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} is missing ({e}); run `carma crds --out-dir crds`",
                path.display()
            )
        });
        if have != want {
            drifted.push(path.display().to_string());
        }
    }
    assert!(
        drifted.is_empty(),
        "CRDs drifted from the code: {drifted:?}; run `carma crds --out-dir crds` (or CARMA_UPDATE_CRDS=1 cargo test -p carma-api) and commit"
    );
}

#[test]
fn crds_carry_names_columns_and_status() {
    for (file, crd) in carma_api::crds::all() {
        let spec = &crd.spec;
        assert_eq!(spec.group, "carma.io", "{file}");
        let names = &spec.names;
        assert!(
            names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
            "{file}: short name"
        );
        let version = &spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{file}: status subresource"
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 3),
            "{file}: printer columns"
        );
    }
    let all = carma_api::crds::all();
    let by_kind = |kind: &str| {
        all.iter()
            .map(|(_, crd)| crd)
            .find(|crd| crd.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} CRD"))
    };
    for (kind, short, scope) in [
        ("TrainingTask", "tt", "Namespaced"),
        ("GpuNode", "gn", "Cluster"),
        ("MemoryHistory", "mh", "Cluster"),
    ] {
        let crd = by_kind(kind);
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&[short.to_string()][..]),
            "{kind}"
        );
        assert_eq!(crd.spec.scope, scope, "{kind}");
    }
    assert_eq!(
        by_kind("MemoryHistory").spec.names.plural,
        "memoryhistories"
    );
}

/// Every property in the generated schemas has a description, so `kubectl explain` helps.
#[test]
fn every_field_is_described() {
    fn walk(path: &str, v: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (k, child) in props {
                let p = format!("{path}.{k}");
                let top_level =
                    path.is_empty() && (k == "apiVersion" || k == "kind" || k == "metadata");
                if !top_level && child.get("description").is_none() {
                    missing.push(p.clone());
                }
                walk(&p, child, missing);
            }
        }
        if let Some(items) = v.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    for (file, crd) in carma_api::crds::all() {
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        let mut missing = Vec::new();
        walk("", &schema, &mut missing);
        assert!(
            missing.is_empty(),
            "{file}: fields without description: {missing:?}"
        );
    }
}
