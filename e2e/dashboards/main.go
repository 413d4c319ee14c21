// Command dashcheck type-checks Grafana dashboards against Grafana's own schema, as the Grafana Foundation
// SDK (github.com/grafana/grafana-foundation-sdk/go, generated from Grafana's CUE schemas) encodes it.
//
// Each file is decoded with the SDK's strict decoder (dashboard.Dashboard.UnmarshalJSONStrict: an unknown
// field, a field of the wrong type or a missing required field is an error), then checked with its
// Validate(). The strict decoder leaves a few places loose, which this program closes:
//
//   - a panel whose type the SDK has no schema for has its options decoded into a map, unchecked: such a
//     panel is an error here, so every panel's options and fieldConfig.defaults.custom are decoded
//     strictly into the SDK's type for its panel (timeseries, stat, table, bargauge, state-timeline, ...);
//   - a panel's fieldConfig is decoded loosely apart from its custom block: it is decoded again here with
//     dashboard.FieldConfigSource.UnmarshalJSONStrict (defaults and overrides);
//   - a query whose datasource type the SDK does not know is kept as an unchecked map: such a query is
//     an error here, so every query is decoded strictly (prometheus.Dataquery for carma's dashboards).
//   - an override property's value is kept untyped: each is decoded here against the field it names,
//     "custom.X" in the panel type's own field config, any other id in dashboard.FieldConfig;
//   - the SDK's decoders return an empty error list as a non-nil error (noErrors).
//
// Usage: dashcheck FILE.json... — prints "ok FILE" or "FAIL FILE" and one "  PATH: MESSAGE" line per
// problem; exits 1 when any file fails, 2 on a usage error.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashcheck FILE.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	failed := 0
	for _, path := range os.Args[1:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Printf("FAIL %s\n  %v\n", path, err)
			failed++
			continue
		}
		problems, summary := check(raw)
		if len(problems) == 0 {
			fmt.Printf("ok   %s (%s)\n", path, summary)
			continue
		}
		failed++
		fmt.Printf("FAIL %s: %d problem(s)\n", path, len(problems))
		for _, p := range problems {
			fmt.Printf("  %s\n", p)
		}
	}
	if failed > 0 {
		fmt.Printf("dashcheck: %d of %d dashboard(s) do not match Grafana's schema\n", failed, len(os.Args)-1)
		os.Exit(1)
	}
}

// check returns the problems of one dashboard ("path: message", sorted) and, when there are none, a
// summary of what was checked.
func check(raw []byte) ([]string, string) {
	var problems []string
	add := func(path string, err error) { problems = append(problems, describe(path, err)...) }

	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return []string{"(file): not a JSON object: " + err.Error()}, ""
	}
	var dash dashboard.Dashboard
	if err := noErrors(dash.UnmarshalJSONStrict(raw)); err != nil {
		add("", err)
	} else if err := noErrors(dash.Validate()); err != nil {
		add("", err)
	}

	// The panels, rows' own panels included, as the JSON has them.
	types := map[string]int{}
	queries := 0
	var rawPanels []json.RawMessage
	_ = json.Unmarshal(top["panels"], &rawPanels)
	for i, rp := range rawPanels {
		path := "panels[" + strconv.Itoa(i) + "]"
		var p struct {
			Type   string            `json:"type"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal(rp, &p); err != nil {
			continue // the strict decoder has reported it
		}
		if p.Type == "row" {
			types["row"]++
			for j, inner := range p.Panels {
				queries += checkPanel(path+".panels["+strconv.Itoa(j)+"]", inner, types, add)
			}
			continue
		}
		queries += checkPanel(path, rp, types, add)
	}
	sort.SliceStable(problems, func(i, j int) bool { return naturalKey(problems[i]) < naturalKey(problems[j]) })
	problems = dedup(problems)

	var kinds []string
	for t, n := range types {
		kinds = append(kinds, fmt.Sprintf("%s×%d", t, n))
	}
	sort.Strings(kinds)
	return problems, fmt.Sprintf("schemaVersion %d, panels %s, %d queries", dash.SchemaVersion, strings.Join(kinds, " "), queries)
}

// checkPanel closes the strict decoder's loose places for one (non-row) panel; it returns its query count.
func checkPanel(path string, raw json.RawMessage, types map[string]int, add func(string, error)) int {
	var p struct {
		Type       string `json:"type"`
		Datasource *struct {
			Type *string `json:"type"`
		} `json:"datasource"`
		FieldConfig json.RawMessage   `json:"fieldConfig"`
		Targets     []json.RawMessage `json:"targets"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return 0
	}
	types[p.Type]++
	cfg, found := cog.ConfigForPanelcfgVariant(p.Type)
	if !found || cfg.StrictOptionsUnmarshaler == nil {
		add(path+".type", fmt.Errorf("panel type %q has no schema in the Grafana Foundation SDK, so its options cannot be checked", p.Type))
	}
	if len(p.FieldConfig) > 0 && string(p.FieldConfig) != "null" {
		var fc dashboard.FieldConfigSource
		if err := noErrors(fc.UnmarshalJSONStrict(p.FieldConfig)); err != nil {
			add(path+".fieldConfig", err)
		} else {
			checkOverrides(path+".fieldConfig", fc, cfg, found, add)
		}
	}
	hint := ""
	if p.Datasource != nil && p.Datasource.Type != nil {
		hint = *p.Datasource.Type
	}
	for i, t := range p.Targets {
		q, err := cog.StrictUnmarshalDataquery(t, hint)
		if noErrors(err) != nil || q == nil {
			continue // the strict decoder has reported it
		}
		if _, unknown := q.(variants.UnknownDataquery); unknown {
			add(path+".targets["+strconv.Itoa(i)+"]", errors.New("the query's datasource type is not one the Grafana Foundation SDK has a schema for, so it cannot be checked"))
		} else if err := noErrors(q.Validate()); err != nil {
			add(path+".targets["+strconv.Itoa(i)+"]", err)
		}
	}
	return len(p.Targets)
}

// checkOverrides checks what the SDK keeps as an untyped value: each override property's value, under its
// id, against the field config it overrides. "custom.X" is field X of the panel type's own field config
// (timeseries.FieldConfig, ...); any other id is a field of dashboard.FieldConfig (unit, color, ...).
// Each is decoded on its own, so only unknown fields and wrong types count, not the required fields the
// one property leaves out.
func checkOverrides(path string, fc dashboard.FieldConfigSource, cfg variants.PanelcfgConfig, found bool, add func(string, error)) {
	for i, o := range fc.Overrides {
		for j, prop := range o.Properties {
			where := fmt.Sprintf("%s.overrides[%d].properties[%d]", path, i, j)
			value, err := json.Marshal(prop.Value)
			if err != nil {
				add(where+".value", err)
				continue
			}
			var decode func([]byte) error
			field := prop.Id
			if custom, ok := strings.CutPrefix(prop.Id, "custom."); ok {
				if !found || cfg.StrictFieldConfigUnmarshaler == nil {
					add(where+".id", fmt.Errorf("%q: the panel type has no custom field config in Grafana's schema", prop.Id))
					continue
				}
				field = custom
				decode = func(raw []byte) error { _, err := cfg.StrictFieldConfigUnmarshaler(raw); return err }
			} else {
				decode = func(raw []byte) error { var f dashboard.FieldConfig; return f.UnmarshalJSONStrict(raw) }
			}
			raw, _ := json.Marshal(map[string]json.RawMessage{field: value})
			var errs cog.BuildErrors
			if err := noErrors(decode(raw)); err != nil && !errors.As(err, &errs) {
				add(where, err)
				continue
			}
			var kept cog.BuildErrors
			for _, e := range errs {
				inside := e.Path == field || strings.HasPrefix(e.Path, field+".") || strings.HasPrefix(e.Path, field+"[")
				if e.Message == "required field is missing from input" && !inside {
					continue
				}
				if m := unexpected.FindStringSubmatch(e.Message); m != nil && m[1] == field {
					kept = append(kept, &cog.BuildError{Path: "id", Message: fmt.Sprintf("%q is not a field Grafana's schema knows here", prop.Id)})
					continue
				}
				kept = append(kept, &cog.BuildError{Path: "value" + strings.TrimPrefix(e.Path, field), Message: e.Message})
			}
			if len(kept) > 0 {
				add(where, kept)
			}
		}
	}
}

// noErrors is nil for no error. The SDK's decoders and Validate() return their cog.BuildErrors as an
// error even when it is empty: a non-nil interface holding a nil slice.
func noErrors(err error) error {
	var errs cog.BuildErrors
	if errors.As(err, &errs) && len(errs) == 0 {
		return nil
	}
	return err
}

var unexpected = regexp.MustCompile(`^unexpected field '(.*)'$`)

// describe turns the SDK's errors into "path: message" lines. The SDK names an unexpected field's parent
// by its Go type ("panels[2].Panel: unexpected field 'x'"); the line names the field itself
// ("panels[2].x: unknown field").
func describe(prefix string, err error) []string {
	var errs cog.BuildErrors
	if !errors.As(err, &errs) {
		var one *cog.BuildError
		if errors.As(err, &one) {
			errs = cog.BuildErrors{one}
		} else {
			p := prefix
			if p == "" {
				p = "(dashboard)"
			}
			return []string{p + ": " + err.Error()}
		}
	}
	var out []string
	for _, e := range errs {
		path, msg := e.Path, e.Message
		if m := unexpected.FindStringSubmatch(msg); m != nil {
			if i := strings.LastIndex(path, "."); i >= 0 {
				path = path[:i+1] + m[1]
			} else {
				path = m[1]
			}
			msg = "unknown field (not in Grafana's schema)"
		}
		if prefix != "" {
			path = prefix + "." + path
		}
		out = append(out, path+": "+msg)
	}
	return out
}

var digits = regexp.MustCompile(`[0-9]+`)

// naturalKey orders "panels[2]" before "panels[10]".
func naturalKey(s string) string {
	return digits.ReplaceAllStringFunc(s, func(d string) string { return fmt.Sprintf("%09s", d) })
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
