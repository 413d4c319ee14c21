// dashcheck: type-checks deploy/grafana/*.json against Grafana's schema as the Grafana Foundation SDK
// (Apache-2.0, generated from Grafana's CUE schemas) encodes it. Run by ci/checks/dashboards.sh.
module github.com/carma/e2e/dashboards

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
