package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// column is one column of a table: its header and where its value is, a
// dotted path into the JSON object.
type column struct {
	header string
	path   string
}

// view says how a table shows an answer: the list under items (the
// resource's plural name), or, with items empty, one object as one row.
type view struct {
	items string
	cols  []column
	more  *view // another table of the same answer, shown after this one
	// each, for -o csv: a list in each item whose elements are the rows,
	// each with its item's other fields (a series' buckets).
	each string
}

func cols(pairs ...string) []column {
	c := make([]column, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		c = append(c, column{pairs[i], pairs[i+1]})
	}
	return c
}

func (a *app) checkOutput() error {
	switch a.output {
	case "table", "json", "yaml", "edn", "csv":
		return nil
	}
	return usagef("-o %q: want table, json, yaml, edn or csv", a.output)
}

// show makes the request and prints its answer as -o asks: EDN comes from
// the server's own encoding, the others from its JSON.
func (a *app) show(cmd *cobra.Command, r request, v view) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	if a.output == "edn" {
		r.accept = "application/edn"
	}
	body, err := c.call(cmd.Context(), r)
	if err != nil {
		return err
	}
	return a.print(body, v)
}

// get shows one GET.
func (a *app) get(cmd *cobra.Command, path string, q url.Values, v view) error {
	return a.show(cmd, request{method: "GET", path: path, query: q}, v)
}

// print writes an answer (JSON, or EDN for -o edn) as -o asks.
func (a *app) print(body []byte, v view) error {
	out := a.env.Stdout
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	switch a.output {
	case "edn":
		out.Write(body)
		if body[len(body)-1] != '\n' {
			fmt.Fprintln(out)
		}
		return nil
	case "json":
		var b bytes.Buffer
		if err := json.Indent(&b, body, "", "  "); err != nil {
			return fmt.Errorf("the server's answer is not JSON: %w", err)
		}
		b.WriteByte('\n')
		_, err := out.Write(b.Bytes())
		return err
	case "yaml":
		y, err := jsonToYAML(body)
		if err != nil {
			return err
		}
		_, err = out.Write(y)
		return err
	case "csv":
		return writeCSV(out, body, v)
	}
	if v.cols == nil {
		y, err := jsonToYAML(body)
		if err != nil {
			return err
		}
		_, err = out.Write(y)
		return err
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var doc map[string]any
	if err := d.Decode(&doc); err != nil {
		return fmt.Errorf("the server's answer is not a JSON object: %w", err)
	}
	for t := &v; t != nil; t = t.more {
		if t != &v {
			fmt.Fprintln(out)
		}
		if err := a.table(doc, *t); err != nil {
			return err
		}
	}
	return nil
}

// table writes the rows v picks from doc.
func (a *app) table(doc map[string]any, v view) error {
	rows := []any{doc}
	if v.items != "" {
		rows, _ = doc[v.items].([]any)
	}
	tw := tabwriter.NewWriter(a.env.Stdout, 0, 4, 2, ' ', 0)
	heads := make([]string, len(v.cols))
	for i, c := range v.cols {
		heads[i] = c.header
	}
	fmt.Fprintln(tw, strings.Join(heads, "\t"))
	for _, r := range rows {
		m, _ := r.(map[string]any)
		cells := make([]string, len(v.cols))
		for i, c := range v.cols {
			cells[i] = cell(lookup(m, c.path))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n, err := strconv.Atoi(fmt.Sprint(doc["count"])); err == nil && v.items != "" && n > len(rows) {
		fmt.Fprintf(a.env.Stderr, "(%d of %d shown; --page and --limit show others)\n", len(rows), n)
	}
	return nil
}

// lookup follows a dotted path into decoded JSON.
func lookup(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// cell is a value as a table shows it: maps as k=v pairs, lists joined by
// commas, nothing as -.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return "-"
	case string:
		if v == "" {
			return "-"
		}
		return strings.ReplaceAll(v, "\n", " ")
	case map[string]any:
		if len(v) == 0 {
			return "-"
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + inline(v[k])
		}
		return strings.Join(parts, ",")
	case []any:
		if len(v) == 0 {
			return "-"
		}
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = inline(e)
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}

func inline(v any) string {
	switch v := v.(type) {
	case string, json.Number, bool, nil:
		return fmt.Sprint(v)
	case []any:
		// A list of words (an error list) reads better without JSON's quotes.
		parts := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				b, _ := json.Marshal(v)
				return string(b)
			}
			parts[i] = s
		}
		return strings.Join(parts, "; ")
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// jsonToYAML re-encodes JSON as block YAML with the keys in the server's
// order. JSON is YAML, so the parser reads it as nodes; dropping the flow
// and quoting styles makes it block YAML, and the encoder still quotes a
// string that would read back as another type ("123", "true").
func jsonToYAML(body []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("the server's answer is not JSON: %w", err)
	}
	var plain func(*yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(&n)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	enc.Close()
	return b.Bytes(), nil
}

// page holds the paging flags of a list.
type page struct{ page, limit int }

func (p *page) flags(c *cobra.Command) {
	c.Flags().IntVar(&p.page, "page", 0, "page `N`, from 1")
	c.Flags().IntVar(&p.limit, "limit", 0, "`N` items per page, 1 to 1000 (the server's default is 50)")
}

// query is q with the paging parameters the flags set.
func (p *page) query(q url.Values) url.Values {
	if q == nil {
		q = url.Values{}
	}
	if p.page > 0 {
		q.Set("page", strconv.Itoa(p.page))
	}
	if p.limit > 0 {
		q.Set("limit", strconv.Itoa(p.limit))
	}
	return q
}
