package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestConfigzClientLimits(t *testing.T) {
	qps, burst, err := parseConfigz([]byte(`{"componentconfig":{"clientConnection":{"kubeconfig":"","acceptContentTypes":"","contentType":"application/vnd.kubernetes.protobuf","qps":1000,"burst":2000},"percentageOfNodesToScore":0}}`))
	if err != nil || qps != 1000 || burst != 2000 {
		t.Fatalf("qps %v burst %v err %v", qps, burst, err)
	}
	if _, _, err := parseConfigz([]byte(`{"componentconfig":{}}`)); err == nil {
		t.Fatal("a configz without clientConnection must not read as QPS 0")
	}
}

const limiterExpo = `rest_client_rate_limiter_duration_seconds_bucket{host="h",verb="POST",le="0.005"} %d
rest_client_rate_limiter_duration_seconds_bucket{host="h",verb="POST",le="0.025"} %d
rest_client_rate_limiter_duration_seconds_bucket{host="h",verb="POST",le="+Inf"} 100
rest_client_rate_limiter_duration_seconds_sum{host="h",verb="POST"} %s
rest_client_rate_limiter_duration_seconds_count{host="h",verb="POST"} 100
`

func limiterSamples(t *testing.T, first, second int, sum string) samples {
	t.Helper()
	ss, err := parseProm(strings.NewReader(fmt.Sprintf(limiterExpo, first, second, sum)))
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// A client is bound when more than 1 % of its requests waited past the lowest bucket (5 ms).
func TestRateLimiterWait(t *testing.T) {
	var empty samples
	free := limiterOf(empty, limiterSamples(t, 100, 100, "0.01"))
	if !free.ok || free.bound() || free.requests != 100 || free.waitS != 0.01 || free.firstBound != 0.005 {
		t.Fatalf("no waits: %+v (bound %v)", free, free.bound())
	}
	if !strings.Contains(free.String(), "≤ 5 ms") {
		t.Fatalf("String: %s", free)
	}
	held := limiterOf(empty, limiterSamples(t, 50, 90, "3.5"))
	if !held.bound() || held.byVerb["POST"] != 3.5 || !strings.HasSuffix(held.String(), "(POST 3.50 s)") {
		t.Fatalf("half the requests waited over 5 ms: %+v", held)
	}
	if none := limiterOf(empty, empty); none.ok || none.bound() {
		t.Fatalf("nothing scraped: %+v", none)
	}
}

func TestCarmaWritesByResource(t *testing.T) {
	parse := func(s string) samples {
		ss, err := parseProm(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return ss
	}
	before := parse(`apiserver_request_total{code="200",group="carma.io",resource="gpunodes",subresource="status",verb="PATCH"} 10
apiserver_request_total{code="201",group="",resource="pods",subresource="",verb="POST"} 5
`)
	after := parse(`apiserver_request_total{code="200",group="carma.io",resource="gpunodes",subresource="status",verb="PATCH"} 40
apiserver_request_total{code="201",group="",resource="pods",subresource="",verb="POST"} 500
apiserver_request_total{code="201",group="",resource="pods",subresource="binding",verb="POST"} 100
apiserver_request_total{code="200",group="",resource="pods",subresource="",verb="PATCH"} 100
apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",subresource="",verb="PUT"} 5
apiserver_request_total{code="200",group="carma.io",resource="gpunodes",subresource="",verb="LIST"} 7
apiserver_request_total{code="200",group="",resource="pods",subresource="",verb="DELETE"} 9
`)
	w := carmaWrites(before, after, 10)
	if w.total != 235 || w.perSecond() != 23.5 {
		t.Fatalf("carma's writes: %+v", w)
	}
	if w.by["POST pods"] != 0 || w.by["DELETE pods"] != 0 || w.by["LIST gpunodes"] != 0 {
		t.Fatalf("the workload's pods and reads are not carma's writes: %v", w.by)
	}
	if !strings.HasPrefix(w.String(), "23.5 per second over 10 s (235 writes: PATCH pods 10.0/s, POST pods/binding 10.0/s, PATCH gpunodes/status 3.0/s") {
		t.Fatalf("String: %s", w)
	}
}

func TestSpreadAndCPU(t *testing.T) {
	s := spreadOf([]float64{3, math.NaN(), 1, 2})
	if s.n != 3 || s.min != 1 || s.median != 2 || s.max != 3 {
		t.Fatalf("%+v", s)
	}
	if e := spreadOf([]float64{4, 2}); e.median != 3 {
		t.Fatalf("even count: %+v", e)
	}
	if got := spreadOf(nil).fmt("%.1f"); got != "not run" {
		t.Fatal(got)
	}
	c := cpuPer1000(map[string]float64{"etcd": 1, "gone": 3}, map[string]float64{"etcd": 3, "new": 9}, 500)
	if len(c) != 1 || c["etcd"] != 4 {
		t.Fatalf("%v", c)
	}
}
