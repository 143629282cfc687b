package fleethttp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/google/uuid"
)

// op describes an endpoint for the OpenAPI document.
type op struct {
	Tag, Summary string
	Query        []param // query parameters, and path parameters that are not strings
	Body         any     // a value of the request body's type; nil for none
	BodyOptional bool    // the body may be left out: no Content-Type, Content-Length 0
	Upload       bool    // the body may also be a raw or multipart file
	OK           int     // the success status; 200 when zero
	Resp         any     // a value of the success body's type; nil for none
	Raw          string  // the success body is this media type, not an encoded value
	// AlsoOK are other success statuses, with what each means; their body
	// is Resp too.
	AlsoOK map[int]string
	// Signed marks a public endpoint that takes an API key, or a signed
	// URL's query parameters instead.
	Signed bool
	// Quiet marks a seed endpoint whose success has an empty body unless the
	// client sends Prefer: return=representation; Resp is that
	// representation.
	Quiet bool
	// Headers are the success's response headers worth a client's notice,
	// by name, with what each says (string values).
	Headers map[string]string
}

// nextLinkHeader is the header of a cursor-paged read's pages (nextLink).
var nextLinkHeader = map[string]string{
	"Link": `the next page's URL, as RFC 8288 writes it: <URL>; rel="next" (this request's URL with cursor set to next); absent after the last page. ` +
		"A client may ask for the next page as soon as it has this header, and read this page's body meanwhile",
}

// takesQuery reports whether the endpoint reads query parameters.
func (o op) takesQuery() bool {
	for _, p := range o.Query {
		if p.In != "path" {
			return true
		}
	}
	return false
}

// param is a query or path parameter.
type param struct {
	Name, Type, Format, Desc string
	In                       string // "query" (default) or "path"
	Enum                     []string
}

// enums lists the values of string types that have a fixed set.
var enums = map[reflect.Type][]string{
	reflect.TypeFor[fleet.Role](): {"viewer", "device", "operator", "admin"},
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// openAPI builds the document from the route table.
func (s *Server) openAPI() map[string]any {
	g := &schemaGen{components: map[string]any{}}
	paths := map[string]any{}
	for _, rt := range s.routes {
		method, path, _ := strings.Cut(rt.pattern, " ")
		item, _ := paths[path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[path] = item
		}
		item[strings.ToLower(method)] = g.operation(rt, path)
	}
	g.components["Error"] = g.schema(reflect.TypeFor[errorBody](), false)
	if g.anyUsed {
		g.components[anyValue] = anyValueSchema()
	}
	return map[string]any{
		"openapi": "3.0.3",
		// The API is wherever this document was read from.
		"servers": []any{map[string]any{"url": "/", "description": "the fleetd that serves this document"}},
		"info": map[string]any{
			"title":   "fleetd",
			"version": "v1",
			"description": "Device fleet management: dispatch actions and follow each device's progress, " +
				"store and serve firmware bundles, watch device data for alert conditions. " +
				"Request bodies may be JSON, Transit (JSON or MessagePack) or EDN; responses follow Accept. " +
				"Every error has the body described by the Error schema.",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas": g.components,
			"securitySchemes": map[string]any{
				"apiKey": map[string]any{"type": "apiKey", "in": "header", "name": "x-service-api-key"},
				"tenant": map[string]any{"type": "apiKey", "in": "header", "name": "x-service-tenant"},
			},
			"responses": map[string]any{
				"Error": map[string]any{
					"description": errorCodesDescription(),
					"content":     g.content(map[string]any{"$ref": "#/components/schemas/Error"}),
				},
			},
		},
	}
}

func (g *schemaGen) operation(rt route, path string) map[string]any {
	o := map[string]any{
		"summary":     rt.op.Summary,
		"tags":        []string{rt.op.Tag},
		"operationId": operationID(rt.pattern),
	}
	var params []any
	declared := map[string]param{}
	for _, p := range rt.op.Query {
		declared[p.Name] = p
	}
	for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
		p, ok := declared[m[1]]
		if !ok {
			p = param{Name: m[1]}
		}
		params = append(params, paramDoc(p, "path"))
	}
	for _, p := range rt.op.Query {
		if p.In != "path" {
			params = append(params, paramDoc(p, "query"))
		}
	}
	if len(params) > 0 {
		o["parameters"] = params
	}
	keys := map[string]any{"apiKey": []string{}, "tenant": []string{}}
	switch {
	case rt.perm != public:
		o["security"] = []any{keys}
	case rt.op.Signed:
		// A key, or none: a signed URL's query parameters.
		o["security"] = []any{keys, map[string]any{}}
	default:
		o["security"] = []any{}
	}
	if rt.op.Body != nil || rt.op.Upload {
		content := map[string]any{}
		if rt.op.Body != nil {
			content = g.content(g.ref(reflect.TypeOf(rt.op.Body), true))
		} else {
			// An upload without an encoded form also takes the raw file.
			content["application/octet-stream"] = map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}
		}
		if rt.op.Upload {
			content["multipart/form-data"] = map[string]any{"schema": map[string]any{
				"type": "object", "properties": map[string]any{"file": map[string]any{"type": "string", "format": "binary"}},
			}}
		}
		o["requestBody"] = map[string]any{"required": !rt.op.BodyOptional, "content": content}
	}
	status := rt.op.OK
	if status == 0 {
		status = http.StatusOK
	}
	ok := map[string]any{"description": http.StatusText(status)}
	switch {
	case rt.op.Raw != "":
		ok["content"] = map[string]any{rt.op.Raw: map[string]any{"schema": map[string]any{}}}
	case rt.op.Quiet:
		ok["description"] = "Empty; with Prefer: return=representation, the resource (x-representation)"
		ok["x-representation"] = g.ref(reflect.TypeOf(rt.op.Resp), false)
	case rt.op.Resp != nil && status != http.StatusNoContent:
		ok["content"] = g.content(g.ref(reflect.TypeOf(rt.op.Resp), false))
	}
	if len(rt.op.Headers) > 0 {
		headers := map[string]any{}
		for name, desc := range rt.op.Headers {
			headers[name] = map[string]any{"description": desc, "schema": map[string]any{"type": "string"}}
		}
		ok["headers"] = headers
	}
	errRef := map[string]any{"$ref": "#/components/responses/Error"}
	responses := map[string]any{strconv.Itoa(status): ok, "4XX": errRef, "default": errRef}
	if status == http.StatusNoContent && rt.op.Resp != nil {
		// With "Prefer: return=representation" the resource comes back.
		responses["200"] = map[string]any{
			"description": "The resource, when the request carried Prefer: return=representation",
			"content":     g.content(g.ref(reflect.TypeOf(rt.op.Resp), false)),
		}
	}
	for code, desc := range rt.op.AlsoOK {
		responses[strconv.Itoa(code)] = map[string]any{"description": desc, "content": g.content(g.ref(reflect.TypeOf(rt.op.Resp), false))}
	}
	o["responses"] = responses
	return o
}

func paramDoc(p param, in string) map[string]any {
	typ := p.Type
	if typ == "" {
		typ = "string"
	}
	schema := map[string]any{"type": typ}
	if p.Format != "" {
		schema["format"] = p.Format
	}
	if len(p.Enum) > 0 {
		schema["enum"] = p.Enum
	}
	d := map[string]any{"name": p.Name, "in": in, "schema": schema}
	if in == "path" {
		d["required"] = true
	}
	if p.Desc != "" {
		d["description"] = p.Desc
	}
	return d
}

// operationID turns "GET /api/v1/devices/{id}" into "get_devices_id".
func operationID(pattern string) string {
	method, path, _ := strings.Cut(pattern, " ")
	path = strings.TrimPrefix(path, "/api/v1")
	path = strings.NewReplacer("{", "", "}", "", "-", "_", ".", "_").Replace(path)
	parts := []string{strings.ToLower(method)}
	for _, p := range strings.Split(path, "/") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "_")
}

// content offers schema under each of the four media types.
func (g *schemaGen) content(schema map[string]any) map[string]any {
	c := map[string]any{}
	for _, f := range codec.Formats {
		c[f.ContentType()] = map[string]any{"schema": schema}
	}
	return c
}

// schemaGen turns Go types into JSON schemas, named types into components.
type schemaGen struct {
	components map[string]any
	anyUsed    bool // a schema refers to the AnyValue component
}

// anyValue is the component of a value of any JSON type, or null.
const anyValue = "AnyValue"

// anyValueSchema says "any JSON value, or null" in OpenAPI 3.0, where null
// is only allowed beside a type (nullable): one of the types, the first of
// them nullable.
func anyValueSchema() map[string]any {
	return map[string]any{
		"description": "any JSON value, or null",
		"anyOf": []any{
			map[string]any{"type": "object", "nullable": true},
			map[string]any{"type": "array", "items": map[string]any{}},
			map[string]any{"type": "string"},
			map[string]any{"type": "number"},
			map[string]any{"type": "boolean"},
		},
	}
}

// any refers to the AnyValue component.
func (g *schemaGen) any() map[string]any {
	g.anyUsed = true
	return map[string]any{"$ref": "#/components/schemas/" + anyValue}
}

var (
	timeType = reflect.TypeFor[time.Time]()
	uuidType = reflect.TypeFor[uuid.UUID]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// ref returns a reference to t's component, made on first use. Request
// types list required fields by their `openapi:"required"` tag; response
// types require every field without omitempty.
func (g *schemaGen) ref(t reflect.Type, request bool) map[string]any {
	if t.Kind() != reflect.Struct || t == timeType {
		return g.schema(t, request)
	}
	name := componentName(t)
	if _, ok := g.components[name]; !ok {
		g.components[name] = map[string]any{} // placeholder for recursion
		g.components[name] = g.schema(t, request)
	}
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

func componentName(t reflect.Type) string {
	name := t.Name()
	if name == "" {
		return "Anonymous"
	}
	return strings.ToUpper(name[:1]) + name[1:]
}

func (g *schemaGen) schema(t reflect.Type, request bool) map[string]any {
	switch t {
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case uuidType:
		return map[string]any{"type": "string", "format": "uuid"}
	case rawType:
		return g.any()
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := g.ref(t.Elem(), request)
		if _, isRef := s["$ref"]; isRef {
			// A struct's component (AnyValue is reached through
			// interfaces, never through a pointer).
			return map[string]any{"type": "object", "allOf": []any{s}, "nullable": true}
		}
		s["nullable"] = true
		return s
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		s := map[string]any{"type": "string"}
		if e, ok := enums[t]; ok {
			s["enum"] = e
		}
		return s
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": g.ref(t.Elem(), request)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.ref(t.Elem(), request)}
	case reflect.Interface:
		return g.any()
	case reflect.Struct:
		props := map[string]any{}
		var required []string
		g.fields(t, request, props, &required)
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": t.Implements(reflect.TypeFor[openBody]())}
		if len(required) > 0 {
			sort.Strings(required)
			s["required"] = required
		}
		return s
	}
	return map[string]any{}
}

// openBody is a request body whose unknown fields are ignored rather than
// refused, as the protocol it belongs to prescribes (hawkBit's DDI
// feedback and configData, docs/hawkbit.md).
type openBody interface{ openBody() }

// fields adds the properties of struct t to props, and the required ones
// to required. The fields of an embedded struct are its own, as in JSON.
func (g *schemaGen) fields(t reflect.Type, request bool, props map[string]any, required *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			g.fields(f.Type, request, props, required)
			continue
		}
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := g.ref(f.Type, request)
		if f.Tag.Get("codec") == "uuid" {
			if items, ok := p["items"].(map[string]any); ok {
				items["format"] = "uuid"
			} else if p["type"] == "string" {
				p["format"] = "uuid"
			}
		}
		if d := f.Tag.Get("doc"); d != "" {
			if _, isRef := p["$ref"]; isRef {
				p = map[string]any{"allOf": []any{p}}
			}
			p["description"] = d
		}
		props[name] = p
		if request && f.Tag.Get("openapi") == "required" || !request && !strings.Contains(opts, "omitempty") {
			*required = append(*required, name)
		}
	}
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.openAPIDoc)
	return nil
}

// errorCodesDescription lists the error codes with their statuses, from
// statuses, in the order of the statuses.
func errorCodesDescription() string {
	codes := slices.Collect(maps.Keys(statuses))
	slices.SortFunc(codes, func(a, b string) int { return cmp.Compare(statuses[a], statuses[b]) })
	var parts []string
	for _, c := range codes {
		part := fmt.Sprintf("%s (%d", c, statuses[c])
		switch c {
		case fleet.ERANGE:
			part += ", artifact downloads"
		case fleet.EGONE:
			part += ", DDI feedback on a finished action"
		}
		parts = append(parts, part+")")
	}
	return "An error: " + strings.Join(parts, ", ") + "."
}
