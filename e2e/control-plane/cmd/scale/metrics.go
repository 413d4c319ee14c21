package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sample is one line of a Prometheus or OpenMetrics text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// samples is one scrape.
type samples []sample

// parseProm reads the text exposition format (Prometheus 0.0.4 and OpenMetrics): comments and blank
// lines are skipped, a trailing timestamp is ignored.
func parseProm(r io.Reader) (samples, error) {
	var out samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		} else if line[i] == '{' {
			s.name = line[:i]
			j := i + 1
			for j < len(line) && line[j] != '}' {
				eq := strings.IndexByte(line[j:], '=')
				if eq < 0 || j+eq+1 >= len(line) || line[j+eq+1] != '"' {
					return nil, fmt.Errorf("metrics line %q: labels", line)
				}
				key := strings.TrimSpace(line[j : j+eq])
				k := j + eq + 2
				var val strings.Builder
				for ; k < len(line) && line[k] != '"'; k++ {
					if line[k] == '\\' && k+1 < len(line) {
						k++
						switch line[k] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(line[k])
						}
						continue
					}
					val.WriteByte(line[k])
				}
				s.labels[key] = val.String()
				j = k + 1
				if j < len(line) && line[j] == ',' {
					j++
				}
			}
			rest = line[min(j+1, len(line)):]
		} else {
			s.name = line[:i]
			rest = line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

func (ss samples) matching(name string, match map[string]string) []sample {
	var out []sample
	for _, s := range ss {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// sum adds every series of name whose labels include match.
func (ss samples) sum(name string, match map[string]string) float64 {
	t := 0.0
	for _, s := range ss.matching(name, match) {
		t += s.value
	}
	return t
}

// by sums name's series whose labels include match, grouped by the labels keys (joined by " ").
func (ss samples) by(name string, match map[string]string, keys ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss.matching(name, match) {
		var parts []string
		for _, k := range keys {
			if s.labels[k] != "" {
				parts = append(parts, s.labels[k])
			}
		}
		out[strings.Join(parts, " ")] += s.value
	}
	return out
}

// hist is a cumulative histogram: upper bound → count, merged over the matching series.
type hist struct {
	buckets map[float64]float64
	count   float64
	sum     float64
}

func (ss samples) histogram(name string, match map[string]string) hist {
	h := hist{buckets: map[float64]float64{}}
	for _, s := range ss.matching(name+"_bucket", match) {
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		h.buckets[le] += s.value
	}
	h.count = ss.sum(name+"_count", match)
	h.sum = ss.sum(name+"_sum", match)
	return h
}

// minus is the histogram of the observations between o and h.
func (h hist) minus(o hist) hist {
	d := hist{buckets: map[float64]float64{}, count: h.count - o.count, sum: h.sum - o.sum}
	for le, c := range h.buckets {
		d.buckets[le] = c - o.buckets[le]
	}
	return d
}

// quantile as Prometheus's histogram_quantile computes it (linear within a bucket; in the +Inf
// bucket, the highest finite bound). NaN without observations.
func (h hist) quantile(q float64) float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	var les []float64
	for le := range h.buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 {
		return math.NaN()
	}
	total := h.buckets[les[len(les)-1]]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	prevLe, prevC := 0.0, 0.0
	for _, le := range les {
		c := h.buckets[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return prevLe
			}
			if c == prevC {
				return le
			}
			return prevLe + (le-prevLe)*(rank-prevC)/(c-prevC)
		}
		prevLe, prevC = le, c
	}
	return prevLe
}

// highestFinite is the largest finite bucket bound (what a quantile in +Inf is clipped to).
func (h hist) highestFinite() float64 {
	hi := 0.0
	for le := range h.buckets {
		if !math.IsInf(le, 1) && le > hi {
			hi = le
		}
	}
	return hi
}

// scrape GETs url with client and parses it.
func scrape(ctx context.Context, client *http.Client, u string) (samples, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: HTTP %d: %s", u, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return parseProm(resp.Body)
}

// ---- the API requests of the benchmark itself ------------------------------------------------------

// requestKey is how kube-apiserver labels a request in apiserver_request_total: verb (LIST, WATCH,
// GET, POST, PUT, PATCH, APPLY, DELETE), resource, subresource.
type requestKey struct{ verb, resource, subresource string }

func (k requestKey) String() string {
	r := k.resource
	if k.subresource != "" {
		r += "/" + k.subresource
	}
	return k.verb + " " + r
}

// classify names a resource request as apiserver_request_total does; ok is false for other
// requests (such as /metrics), which that counter leaves out.
func classify(method string, u *url.URL, contentType string) (k requestKey, ok bool) {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return k, false
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
		rest = rest[2:]
	}
	name := ""
	if len(rest) > 0 {
		k.resource = rest[0]
	}
	if len(rest) > 1 {
		name = rest[1]
	}
	if len(rest) > 2 {
		k.subresource = rest[2]
	}
	switch method {
	case http.MethodGet:
		switch {
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			k.verb = "WATCH"
		case name == "":
			k.verb = "LIST"
		default:
			k.verb = "GET"
		}
	case http.MethodDelete:
		k.verb = "DELETE" // a collection's too, as the server counts it
	case http.MethodPatch:
		k.verb = "PATCH"
		if contentType == "application/apply-patch+yaml" {
			k.verb = "APPLY"
		}
	default:
		k.verb = method
	}
	return k, true
}

// counter counts the requests this program sends to kube-apiserver, as apiserver_request_total
// labels them, so that its own traffic (pod creation and deletion, hollow nodes) can be told apart
// from kube-scheduler's and the extender's.
type counter struct {
	mu sync.Mutex
	n  map[requestKey]int64
}

func (c *counter) snapshot() map[requestKey]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[requestKey]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

type countingRT struct {
	c  *counter
	rt http.RoundTripper
}

func (t countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if k, ok := classify(r.Method, r.URL, r.Header.Get("Content-Type")); ok {
		t.c.mu.Lock()
		t.c.n[k]++
		t.c.mu.Unlock()
	}
	return t.rt.RoundTrip(r)
}

// apiRequests reads apiserver_request_total by requestKey.
func apiRequests(ss samples) map[requestKey]float64 {
	out := map[requestKey]float64{}
	for _, s := range ss.matching("apiserver_request_total", nil) {
		out[requestKey{s.labels["verb"], s.labels["resource"], s.labels["subresource"]}] += s.value
	}
	return out
}

// ---- processes ---------------------------------------------------------------------------------------

var clkTck = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}()

// procStat reads a process's resident set (MiB, /proc/<pid>/status VmRSS) and CPU seconds (user +
// system, /proc/<pid>/stat).
func procStat(pid int) (rssMiB, cpuS float64, err error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	found := false
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, 0, err
			}
			rssMiB, found = kb/1024, true
		}
	}
	if !found {
		return 0, 0, fmt.Errorf("pid %d: no VmRSS", pid)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("pid %d: stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state): utime is field 14, stime 15
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("pid %d: stat %q", pid, s)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	stt, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("pid %d: stat %q", pid, s)
	}
	return rssMiB, (ut + stt) / clkTck, nil
}

// pidOf reads $WORK/pids/<name> (the scripts' pid files).
func pidOf(work, name string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(work, "pids", name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(raw)))
}

// rssSampler samples a process's RSS every interval until stopped: the peak and the last sample.
type rssSampler struct {
	peak, last atomic.Uint64 // MiB × 1024
	n          atomic.Int64
	stop       chan struct{}
	done       chan struct{}
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			if rss, _, err := procStat(pid); err == nil {
				v := uint64(rss * 1024)
				s.last.Store(v)
				s.n.Add(1)
				for {
					p := s.peak.Load()
					if v <= p || s.peak.CompareAndSwap(p, v) {
						break
					}
				}
			}
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return s
}

func (s *rssSampler) finish() (peakMiB, lastMiB float64, n int64) {
	close(s.stop)
	<-s.done
	return float64(s.peak.Load()) / 1024, float64(s.last.Load()) / 1024, s.n.Load()
}

// ---- the machine --------------------------------------------------------------------------------------

// machineSample: the 1-minute load average, and how many rustc and kube-apiserver processes run
// (a second kube-apiserver is another control plane on the same machine).
func machineSample() (load float64, rustc, apiservers int) {
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 0 {
			load, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, d := range dirs {
		raw, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(raw)) {
		case "rustc":
			rustc++
		case "kube-apiserver":
			apiservers++
		}
	}
	return load, rustc, apiservers
}

// machineWatch samples the machine every interval until stopped.
type machineWatch struct {
	mu                       sync.Mutex
	n, withRustc, withOthers int
	maxLoad, sumLoad         float64
	stop, done               chan struct{}
}

func watchMachine(every time.Duration) *machineWatch {
	m := &machineWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			load, rustc, apis := machineSample()
			m.mu.Lock()
			m.n++
			m.sumLoad += load
			m.maxLoad = math.Max(m.maxLoad, load)
			if rustc > 0 {
				m.withRustc++
			}
			if apis > 1 {
				m.withOthers++
			}
			m.mu.Unlock()
			select {
			case <-m.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return m
}

// finish stops the sampling and describes what it saw.
func (m *machineWatch) finish() string {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return "not sampled"
	}
	return fmt.Sprintf("load average mean %.1f, max %.1f; rustc running in %d of %d samples, another kube-apiserver in %d",
		m.sumLoad/float64(m.n), m.maxLoad, m.withRustc, m.n, m.withOthers)
}
