package codec

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// emitter writes the tokens of one format. The encoder walks a Go value and
// calls it; the emitter decides how each token looks (keyword keys,
// instants, the Transit cache) and keeps the first error it meets.
type emitter interface {
	null()
	boolean(bool)
	integer(int64)
	unsigned(uint64)
	float(f float64, bits int)
	str(string)
	binary([]byte)
	instant(time.Time)
	uuid(uuid.UUID)
	// raw embeds JSON text, a json.RawMessage or a json.Marshaler's output.
	raw(enc *encoder, b []byte)
	beginArray(n int)
	endArray()
	// beginMap starts a map of n entries whose keys come through key.
	beginMap(n int)
	key(string)
	endMap()
	// rich writes a full-fidelity value: Keyword, Symbol, Char, *big.Int,
	// BigDecimal, URI, Set, List, *Map or Tagged.
	rich(enc *encoder, v any)
	// finish completes the output; it returns the first error met.
	finish() error
}

// maxEncodeDepth stops a cyclic value, which would otherwise recurse until
// the stack overflows.
const maxEncodeDepth = 1000

// encoder walks a Go value for an emitter.
type encoder struct {
	e     emitter
	err   error
	depth int
}

func (enc *encoder) fail(err error) {
	if enc.err == nil {
		enc.err = err
	}
}

var bufferPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func encodeTo(buf *bytes.Buffer, f Format, v any) error {
	var e emitter
	switch f {
	case JSON:
		e = &jsonEmitter{buf: buf}
	case TransitJSON:
		e = newTransitJSONEmitter(buf, false)
	case TransitMsgpack:
		e = newMsgpackEmitter(buf)
	case EDN:
		e = &ednEmitter{buf: buf}
	default:
		return fmt.Errorf("codec: unknown format %d", int(f))
	}
	enc := encoder{e: e}
	enc.any(v)
	err := e.finish()
	if enc.err != nil {
		err = enc.err
	}
	if err != nil {
		buf.Reset()
	}
	return err
}

// enter counts one level of nesting; false means stop: the value is too
// deep to be anything but a cycle.
func (enc *encoder) enter() bool {
	enc.depth++
	if enc.depth > maxEncodeDepth {
		enc.fail(fmt.Errorf("codec: value nests deeper than %d levels (a cycle?)", maxEncodeDepth))
		return false
	}
	return true
}

// any encodes v, taking the types of canonical values without reflection.
func (enc *encoder) any(v any) {
	if enc.err != nil {
		return
	}
	e := enc.e
	switch v := v.(type) {
	case nil:
		e.null()
	case string:
		e.str(v)
	case bool:
		e.boolean(v)
	case int64:
		e.integer(v)
	case int:
		e.integer(int64(v))
	case float64:
		e.float(v, 64)
	case []any:
		enc.slice(v)
	case map[string]any:
		stringMap(enc, v, (*encoder).any)
	case time.Time:
		e.instant(v)
	case uuid.UUID:
		e.uuid(v)
	case json.RawMessage:
		e.raw(enc, v)
	case []byte:
		e.binary(v)
	case Keyword, Symbol, Char, *big.Int, BigDecimal, URI, Set, List, *Map, Tagged:
		if !enc.enter() {
			return
		}
		e.rich(enc, v)
		enc.depth--
	default:
		rv := reflect.ValueOf(v)
		typeEncoder(rv.Type())(enc, rv)
	}
}

func (enc *encoder) slice(a []any) {
	if !enc.enter() {
		return
	}
	enc.e.beginArray(len(a))
	for _, x := range a {
		enc.any(x)
	}
	enc.e.endArray()
	enc.depth--
}

// stringMap encodes m with its keys in order, without reflection: besides
// canonical maps, the domain's metadata (map[string]string) and errors
// (map[string][]string) are in most responses, and through reflection
// each entry cost two allocations and a map a third (typedStringMap).
func stringMap[V any](enc *encoder, m map[string]V, value func(*encoder, V)) {
	if !enc.enter() {
		return
	}
	var small [16]string // as a map of up to 16 entries stays on the stack
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	enc.e.beginMap(len(m))
	for _, k := range keys {
		enc.e.key(k)
		value(enc, m[k])
	}
	enc.e.endMap()
	enc.depth--
}

// typedStringMap encodes a map[string]V through stringMap as the
// reflective map encoder did: nil is null.
func typedStringMap[V any](value func(*encoder, V)) encoderFunc {
	return func(enc *encoder, v reflect.Value) {
		if v.IsNil() {
			enc.e.null()
			return
		}
		stringMap(enc, v.Interface().(map[string]V), value)
	}
}

// str and strings encode as the reflective encoders of string and
// []string do.
func (enc *encoder) str(s string) { enc.e.str(s) }

func (enc *encoder) strings(list []string) {
	if list == nil {
		enc.e.null()
		return
	}
	if !enc.enter() {
		return
	}
	enc.e.beginArray(len(list))
	for _, s := range list {
		enc.e.str(s)
	}
	enc.e.endArray()
	enc.depth--
}

// encoderFunc encodes a value of one type.
type encoderFunc func(enc *encoder, v reflect.Value)

var encoderCache sync.Map // reflect.Type -> encoderFunc

// typeEncoder returns the cached encoder of t, building it once. A
// recursive type finds a stand-in that waits for the real one, as in
// encoding/json.
func typeEncoder(t reflect.Type) encoderFunc {
	if f, ok := encoderCache.Load(t); ok {
		return f.(encoderFunc)
	}
	var (
		wg sync.WaitGroup
		f  encoderFunc
	)
	wg.Add(1)
	fi, loaded := encoderCache.LoadOrStore(t, encoderFunc(func(enc *encoder, v reflect.Value) {
		wg.Wait()
		f(enc, v)
	}))
	if loaded {
		return fi.(encoderFunc)
	}
	f = newTypeEncoder(t)
	wg.Done()
	encoderCache.Store(t, f)
	return f
}

var (
	timeType          = reflect.TypeFor[time.Time]()
	uuidType          = reflect.TypeFor[uuid.UUID]()
	rawMessageType    = reflect.TypeFor[json.RawMessage]()
	bigIntType        = reflect.TypeFor[big.Int]()
	mapType           = reflect.TypeFor[Map]()
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func richEncoder(enc *encoder, v reflect.Value) {
	enc.any(v.Interface())
}

func newTypeEncoder(t reflect.Type) encoderFunc {
	switch t {
	case timeType:
		return func(enc *encoder, v reflect.Value) { enc.e.instant(v.Interface().(time.Time)) }
	case uuidType:
		return func(enc *encoder, v reflect.Value) { enc.e.uuid(v.Interface().(uuid.UUID)) }
	case rawMessageType:
		return func(enc *encoder, v reflect.Value) { enc.e.raw(enc, v.Bytes()) }
	case bigIntType:
		return func(enc *encoder, v reflect.Value) {
			b := new(big.Int)
			*b = v.Interface().(big.Int)
			enc.any(b)
		}
	case mapType:
		return func(enc *encoder, v reflect.Value) {
			m := v.Interface().(Map)
			enc.any(&m)
		}
	case reflect.TypeFor[map[string]string]():
		return typedStringMap((*encoder).str)
	case reflect.TypeFor[map[string][]string]():
		return typedStringMap((*encoder).strings)
	case reflect.TypeFor[Keyword](), reflect.TypeFor[Symbol](), reflect.TypeFor[Char](),
		reflect.TypeFor[*big.Int](), reflect.TypeFor[BigDecimal](), reflect.TypeFor[URI](),
		reflect.TypeFor[Set](), reflect.TypeFor[List](), reflect.TypeFor[*Map](), reflect.TypeFor[Tagged]():
		return richEncoder
	}
	if t.Kind() != reflect.Pointer && t.Implements(jsonMarshalerType) {
		return func(enc *encoder, v reflect.Value) {
			b, err := v.Interface().(json.Marshaler).MarshalJSON()
			if err != nil {
				enc.fail(fmt.Errorf("codec: %v: %w", t, err))
				return
			}
			enc.e.raw(enc, b)
		}
	}
	if t.Kind() != reflect.Pointer && t.Implements(textMarshalerType) {
		return func(enc *encoder, v reflect.Value) {
			b, err := v.Interface().(encoding.TextMarshaler).MarshalText()
			if err != nil {
				enc.fail(fmt.Errorf("codec: %v: %w", t, err))
				return
			}
			enc.e.str(string(b))
		}
	}
	switch t.Kind() {
	case reflect.Bool:
		return func(enc *encoder, v reflect.Value) { enc.e.boolean(v.Bool()) }
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(enc *encoder, v reflect.Value) { enc.e.integer(v.Int()) }
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(enc *encoder, v reflect.Value) { enc.e.unsigned(v.Uint()) }
	case reflect.Float32:
		return func(enc *encoder, v reflect.Value) { enc.e.float(v.Float(), 32) }
	case reflect.Float64:
		return func(enc *encoder, v reflect.Value) { enc.e.float(v.Float(), 64) }
	case reflect.String:
		return func(enc *encoder, v reflect.Value) { enc.e.str(v.String()) }
	case reflect.Interface:
		return func(enc *encoder, v reflect.Value) {
			if v.IsNil() {
				enc.e.null()
				return
			}
			enc.any(v.Elem().Interface())
		}
	case reflect.Pointer:
		return newPointerEncoder(t)
	case reflect.Struct:
		return newStructEncoder(t)
	case reflect.Map:
		return newMapEncoder(t)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return func(enc *encoder, v reflect.Value) {
				if v.IsNil() {
					enc.e.null()
					return
				}
				enc.e.binary(v.Bytes())
			}
		}
		elem := typeEncoder(t.Elem())
		return func(enc *encoder, v reflect.Value) {
			if v.IsNil() {
				enc.e.null()
				return
			}
			enc.array(v, elem)
		}
	case reflect.Array:
		elem := typeEncoder(t.Elem())
		return func(enc *encoder, v reflect.Value) { enc.array(v, elem) }
	}
	return func(enc *encoder, v reflect.Value) {
		enc.fail(fmt.Errorf("codec: cannot encode a value of type %v", t))
	}
}

func (enc *encoder) array(v reflect.Value, elem encoderFunc) {
	if !enc.enter() {
		return
	}
	n := v.Len()
	enc.e.beginArray(n)
	for i := 0; i < n && enc.err == nil; i++ {
		elem(enc, v.Index(i))
	}
	enc.e.endArray()
	enc.depth--
}

func newPointerEncoder(t reflect.Type) encoderFunc {
	elem := typeEncoder(t.Elem())
	return func(enc *encoder, v reflect.Value) {
		if v.IsNil() {
			enc.e.null()
			return
		}
		if !enc.enter() {
			return
		}
		elem(enc, v.Elem())
		enc.depth--
	}
}

func newMapEncoder(t reflect.Type) encoderFunc {
	keyString := mapKeyFunc(t.Key())
	if keyString == nil {
		return func(enc *encoder, v reflect.Value) {
			enc.fail(fmt.Errorf("codec: cannot encode a map with keys of type %v", t.Key()))
		}
	}
	elem := typeEncoder(t.Elem())
	return func(enc *encoder, v reflect.Value) {
		if v.IsNil() {
			enc.e.null()
			return
		}
		if !enc.enter() {
			return
		}
		type entry struct {
			k string
			v reflect.Value
		}
		entries := make([]entry, 0, v.Len())
		for it := v.MapRange(); it.Next(); {
			k, err := keyString(it.Key())
			if err != nil {
				enc.fail(err)
				return
			}
			entries = append(entries, entry{k, it.Value()})
		}
		slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.k, b.k) })
		enc.e.beginMap(len(entries))
		for _, en := range entries {
			enc.e.key(en.k)
			elem(enc, en.v)
		}
		enc.e.endMap()
		enc.depth--
	}
}

// mapKeyFunc returns how map keys of type t become strings, as
// encoding/json does it, or nil when they cannot.
func mapKeyFunc(t reflect.Type) func(reflect.Value) (string, error) {
	switch {
	case t.Kind() == reflect.String:
		return func(v reflect.Value) (string, error) { return v.String(), nil }
	case t.Implements(textMarshalerType) && t.Kind() != reflect.Pointer:
		return func(v reflect.Value) (string, error) {
			b, err := v.Interface().(encoding.TextMarshaler).MarshalText()
			return string(b), err
		}
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(v reflect.Value) (string, error) { return strconv.FormatInt(v.Int(), 10), nil }
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(v reflect.Value) (string, error) { return strconv.FormatUint(v.Uint(), 10), nil }
	}
	return nil
}

// field is one encoded field of a struct, found as encoding/json finds it.
type field struct {
	name      string
	index     []int
	typ       reflect.Type
	tagged    bool
	omitEmpty bool
	omitZero  bool
	uuid      bool // tagged codec:"uuid": a string that holds a UUID
	enc       encoderFunc
}

func newStructEncoder(t reflect.Type) encoderFunc {
	fields := structFields(t)
	for i := range fields {
		fields[i].enc = typeEncoder(fields[i].typ)
		if fields[i].uuid {
			fields[i].enc = uuidStringEncoder(fields[i].typ, fields[i].enc)
		}
	}
	return func(enc *encoder, v reflect.Value) {
		if !enc.enter() {
			return
		}
		// Counted first: MessagePack writes the size before the entries.
		// The fields are found twice rather than kept: a slice of them was
		// a tenth of an S7 page's garbage.
		n := 0
		for i := range fields {
			if _, ok := fields[i].value(v); ok {
				n++
			}
		}
		enc.e.beginMap(n)
		for i := range fields {
			if fv, ok := fields[i].value(v); ok {
				enc.e.key(fields[i].name)
				fields[i].enc(enc, fv)
			}
		}
		enc.e.endMap()
		enc.depth--
	}
}

// value returns the field of struct v; false when it is omitted.
func (f *field) value(v reflect.Value) (reflect.Value, bool) {
	fv, ok := fieldByIndex(v, f.index)
	if !ok || f.omitEmpty && isEmptyValue(fv) || f.omitZero && isZeroValue(fv) {
		return reflect.Value{}, false
	}
	return fv, true
}

// uuidStringEncoder encodes a field tagged codec:"uuid": a string (or a
// slice of them, or a pointer to one) whose value is a UUID is written as
// one, so that Transit and EDN clients get a UUID (~u, #uuid) wherever the
// domain keeps a UUID as a string; JSON sees no difference. A value that
// is not a UUID in canonical form stays a string.
func uuidStringEncoder(t reflect.Type, plain encoderFunc) encoderFunc {
	switch t.Kind() {
	case reflect.String:
		return func(enc *encoder, v reflect.Value) {
			s := v.String()
			if u, err := uuid.Parse(s); err == nil && len(s) == 36 {
				enc.e.uuid(u)
				return
			}
			enc.e.str(s)
		}
	case reflect.Slice, reflect.Pointer:
		if t.Elem().Kind() != reflect.String {
			break
		}
		elem := uuidStringEncoder(t.Elem(), nil)
		if t.Kind() == reflect.Pointer {
			return func(enc *encoder, v reflect.Value) {
				if v.IsNil() {
					enc.e.null()
					return
				}
				elem(enc, v.Elem())
			}
		}
		return func(enc *encoder, v reflect.Value) {
			if v.IsNil() {
				enc.e.null()
				return
			}
			enc.array(v, elem)
		}
	}
	return plain
}

// fieldByIndex follows an embedded path; ok is false when it passes through
// a nil embedded pointer, whose fields are then absent.
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}

func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

func isZeroValue(v reflect.Value) bool {
	if z, ok := v.Interface().(interface{ IsZero() bool }); ok {
		if v.Kind() == reflect.Pointer && v.IsNil() {
			return true
		}
		return z.IsZero()
	}
	return v.IsZero()
}

// structFields lists the encoded fields of t in encoding/json's order and
// with its rules: exported fields, embedded structs promoted, json tags for
// names, the shallowest field winning a name and a tagged one breaking ties.
func structFields(t reflect.Type) []field {
	type queued struct {
		typ   reflect.Type
		index []int
	}
	var fields []field
	visited := map[reflect.Type]bool{}
	next := []queued{{typ: t}}
	for len(next) > 0 {
		current := next
		next = nil
		count := map[string]int{}
		var level []field
		for _, q := range current {
			if visited[q.typ] {
				continue
			}
			visited[q.typ] = true
			for i := 0; i < q.typ.NumField(); i++ {
				sf := q.typ.Field(i)
				ft := sf.Type
				if sf.Anonymous {
					if ft.Kind() == reflect.Pointer {
						ft = ft.Elem()
					}
					if !sf.IsExported() && ft.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, opts, _ := strings.Cut(tag, ",")
				index := append(slices.Clone(q.index), i)
				if name == "" && sf.Anonymous && ft.Kind() == reflect.Struct {
					next = append(next, queued{typ: ft, index: index})
					continue
				}
				f := field{
					name:      name,
					index:     index,
					typ:       sf.Type,
					tagged:    name != "",
					omitEmpty: hasOption(opts, "omitempty"),
					omitZero:  hasOption(opts, "omitzero"),
					uuid:      sf.Tag.Get("codec") == "uuid",
				}
				if f.name == "" {
					f.name = sf.Name
				}
				level = append(level, f)
				count[f.name]++
			}
		}
		// A name taken at a shallower level hides this level's; two at the
		// same level cancel out unless exactly one is tagged.
		taken := map[string]bool{}
		for _, f := range fields {
			taken[f.name] = true
		}
		for _, f := range level {
			if taken[f.name] {
				continue
			}
			if count[f.name] > 1 {
				tagged := 0
				for _, g := range level {
					if g.name == f.name && g.tagged {
						tagged++
					}
				}
				if tagged != 1 || !f.tagged {
					continue
				}
			}
			fields = append(fields, f)
		}
	}
	slices.SortStableFunc(fields, func(a, b field) int { return slices.Compare(a.index, b.index) })
	return fields
}

func hasOption(opts, name string) bool {
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		if o == name {
			return true
		}
	}
	return false
}
