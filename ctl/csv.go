package ctl

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// -o csv (docs/cli.md, fleetctl's help): the list a command shows (its view's items,
// or the one object it answers) as one header row and a row an item, a
// column per field. Nested objects are flattened: a field of an object is
// a column named by its dotted path (data.temperature, data.gps.lat); an
// array is one column holding its JSON; null and a field an item lacks are
// empty. Columns come in the order the server names the fields, a field
// first seen in a later row after the other fields of its object. With
// view.each, every element of that list in an item is a row of its own,
// beside the item's other fields (one row per bucket of each device's
// series).

// writeCSV writes an answer's list as CSV.
func writeCSV(out io.Writer, body []byte, v view) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(body, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("the server's answer is not a JSON object")
	}
	items := []*yaml.Node{doc.Content[0]}
	if v.items != "" {
		items = nil
		if l := member(doc.Content[0], v.items); l != nil {
			items = l.Content
		}
	}
	var t csvTable
	for _, it := range items {
		if v.each == "" {
			t.add(it)
			continue
		}
		for _, e := range member(it, v.each).Content {
			row := &yaml.Node{Kind: yaml.MappingNode}
			for i := 0; i+1 < len(it.Content); i += 2 {
				if it.Content[i].Value != v.each {
					row.Content = append(row.Content, it.Content[i], it.Content[i+1])
				}
			}
			row.Content = append(row.Content, e.Content...)
			t.add(row)
		}
	}
	if len(t.cols) == 0 {
		return nil // no row, or rows without a field
	}
	w := csv.NewWriter(out)
	w.Write(t.cols)
	for _, r := range t.rows {
		line := make([]string, len(t.cols))
		for i, c := range t.cols {
			line[i] = r[c]
		}
		w.Write(line)
	}
	w.Flush()
	return w.Error()
}

// member is the value of key in a mapping node, or an empty sequence.
func member(m *yaml.Node, key string) *yaml.Node {
	for i := 0; m != nil && i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return &yaml.Node{Kind: yaml.SequenceNode}
}

// csvTable gathers flattened rows and their columns in order.
type csvTable struct {
	cols []string
	seen map[string]bool
	rows []map[string]string
}

func (t *csvTable) add(item *yaml.Node) {
	row := map[string]string{}
	t.flatten(row, "", item)
	t.rows = append(t.rows, row)
}

func (t *csvTable) flatten(row map[string]string, prefix string, n *yaml.Node) {
	switch {
	case n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			t.flatten(row, prefix+n.Content[i].Value+".", n.Content[i+1])
		}
		return
	case n.Kind == yaml.SequenceNode:
		var v any
		n.Decode(&v)
		b, _ := json.Marshal(jsonable(v))
		t.set(row, prefix, string(b))
	case n.Tag == "!!null":
		t.set(row, prefix, "")
	default:
		t.set(row, prefix, n.Value)
	}
}

// set puts a value in its column, made after its siblings when new.
func (t *csvTable) set(row map[string]string, prefix, value string) {
	col := strings.TrimSuffix(prefix, ".")
	row[col] = value
	if t.seen[col] {
		return
	}
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	t.seen[col] = true
	at := len(t.cols)
	if dot := strings.LastIndexByte(col, '.'); dot >= 0 {
		for i, c := range t.cols {
			if strings.HasPrefix(c, col[:dot+1]) {
				at = i + 1
			}
		}
	}
	t.cols = append(t.cols[:at], append([]string{col}, t.cols[at:]...)...)
}

// jsonable turns what YAML decodes (maps keyed by any) into what JSON
// encodes.
func jsonable(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonable(e)
		}
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = jsonable(e)
		}
	}
	return v
}
