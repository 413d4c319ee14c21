package main

import (
	"math"
	"net/url"
	"strings"
	"testing"
)

const expo = `# HELP scheduler_scheduling_attempt_duration_seconds x
# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.001"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.002"} 50
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.004"} 100
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="+Inf"} 100
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 0.2
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 100
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="binding",verb="POST",version="v1"} 7 1700000000
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="",verb="POST",version="v1"} 3
carma_extender_binds_total{result="bound"} 5
weird{a="x\"y",b="1,2"} 1
# EOF
`

func TestParseAndQuantile(t *testing.T) {
	ss, err := parseProm(strings.NewReader(expo))
	if err != nil {
		t.Fatal(err)
	}
	h := ss.histogram("scheduler_scheduling_attempt_duration_seconds", map[string]string{"result": "scheduled"})
	if h.count != 100 || math.Abs(h.quantile(0.5)-0.002) > 1e-9 || math.Abs(h.quantile(0.99)-0.00396) > 1e-9 {
		t.Fatalf("histogram %+v: p50 %v p99 %v", h, h.quantile(0.5), h.quantile(0.99))
	}
	if d := h.minus(h); d.count != 0 || !math.IsNaN(d.quantile(0.5)) {
		t.Fatalf("empty difference: %+v", d)
	}
	api := apiRequests(ss)
	if api[requestKey{"POST", "pods", "binding"}] != 7 || api[requestKey{"POST", "pods", ""}] != 3 {
		t.Fatalf("apiserver_request_total: %v", api)
	}
	if ss.by("carma_extender_binds_total", nil, "result")["bound"] != 5 {
		t.Fatal("binds by result")
	}
	if w := ss.matching("weird", nil); len(w) != 1 || w[0].labels["a"] != `x"y` || w[0].labels["b"] != "1,2" {
		t.Fatalf("escaped labels: %+v", w)
	}
}

func TestQuantileInTheInfBucketIsTheHighestBound(t *testing.T) {
	h := hist{buckets: map[float64]float64{1: 1, 2: 1, math.Inf(1): 10}, count: 10}
	if q := h.quantile(0.99); q != 2 || h.highestFinite() != 2 {
		t.Fatalf("p99 %v", q)
	}
}

func TestClassifyAsTheAPIServerCounts(t *testing.T) {
	cases := []struct {
		method, u, ct string
		want          string
		ok            bool
	}{
		{"POST", "/api/v1/namespaces/scale/pods", "", "POST pods", true},
		{"POST", "/api/v1/namespaces/scale/pods/p1/binding", "", "POST pods/binding", true},
		{"PATCH", "/api/v1/namespaces/scale/pods/p1", "application/merge-patch+json", "PATCH pods", true},
		{"PATCH", "/apis/carma.io/v1alpha1/gpunodes/n1/status", "", "PATCH gpunodes/status", true},
		{"GET", "/api/v1/namespaces/scale/pods?watch=true", "", "WATCH pods", true},
		{"GET", "/api/v1/nodes", "", "LIST nodes", true},
		{"GET", "/api/v1/nodes/n1", "", "GET nodes", true},
		{"DELETE", "/api/v1/namespaces/scale/pods?labelSelector=x", "", "DELETE pods", true},
		{"PATCH", "/api/v1/nodes/n1", "application/apply-patch+yaml", "APPLY nodes", true},
		{"GET", "/metrics", "", "", false},
	}
	for _, c := range cases {
		u, _ := url.Parse(c.u)
		k, ok := classify(c.method, u, c.ct)
		if ok != c.ok || (ok && k.String() != c.want) {
			t.Errorf("%s %s: %v %v, want %q %v", c.method, c.u, k, ok, c.want, c.ok)
		}
	}
}

func TestProcStatReadsThisProcess(t *testing.T) {
	rss, cpu, err := procStat(1)
	if err != nil || rss <= 0 || cpu < 0 {
		t.Fatalf("rss %v cpu %v: %v", rss, cpu, err)
	}
}
