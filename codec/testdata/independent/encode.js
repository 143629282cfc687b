// encode.js writes test values with independent Transit and EDN writers
// (transit-js, edn-data) for codec's TestIndependentEncoders.
//
// Standard input: a JSON array of values in this schema; standard output: a
// JSON array of {"transit": "...", "edn": "..."}, one per value.
//   null, true, 1, 2.5, "s"      themselves
//   {"k": v, ...}                 a map with keyword keys
//   {"$map": [[k, v], ...]}       a map with the given keys (strings stay strings)
//   {"$kw": "ns/name"}            a keyword;  {"$sym": "name"} a symbol
//   {"$int": "123"}               an integer beyond JavaScript's 2^53
//   {"$inst": "2026-...Z"}        an instant; {"$uuid": "..."} a UUID
//   {"$set": [...]}, {"$list": [...]}
'use strict';

const transit = require('transit-js');
const edn = require('edn-data');

function special(v) {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return null;
  const keys = Object.keys(v);
  return keys.length === 1 && keys[0].startsWith('$') ? keys[0] : null;
}

function toTransit(v) {
  if (Array.isArray(v)) return v.map(toTransit);
  if (v === null || typeof v !== 'object') return v;
  switch (special(v)) {
    case '$map': return transit.map(v.$map.flatMap(([k, x]) => [toTransit(k), toTransit(x)]));
    case '$kw': return transit.keyword(v.$kw);
    case '$sym': return transit.symbol(v.$sym);
    case '$int': return transit.integer(v.$int);
    case '$inst': return new Date(v.$inst);
    case '$uuid': return transit.uuid(v.$uuid);
    case '$set': return transit.set(v.$set.map(toTransit));
    case '$list': return transit.list(v.$list.map(toTransit));
  }
  return transit.map(Object.entries(v).flatMap(([k, x]) => [transit.keyword(k), toTransit(x)]));
}

function toEDN(v) {
  if (Array.isArray(v)) return v.map(toEDN);
  if (v === null || typeof v !== 'object') return v;
  switch (special(v)) {
    case '$map': return { map: v.$map.map(([k, x]) => [toEDN(k), toEDN(x)]) };
    case '$kw': return edn.toKeyword(v.$kw);
    case '$sym': return edn.toSymbol(v.$sym);
    case '$int': return BigInt(v.$int);
    case '$inst': return new Date(v.$inst);
    case '$uuid': return edn.tagValue('uuid', v.$uuid);
    case '$set': return { set: v.$set.map(toEDN) };
    case '$list': return { list: v.$list.map(toEDN) };
  }
  return { map: Object.entries(v).map(([k, x]) => [edn.toKeyword(k), toEDN(x)]) };
}

let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const writer = transit.writer('json');
  const out = JSON.parse(input).map((v) => ({
    transit: writer.write(toTransit(v)),
    edn: edn.toEDNString(toEDN(v)),
  }));
  process.stdout.write(JSON.stringify(out));
});
