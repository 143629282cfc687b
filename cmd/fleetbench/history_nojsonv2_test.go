//go:build !goexperiment.jsonv2

package main

// moreDecoders are the decoders BenchmarkPointPage weighs beyond its own:
// none without GOEXPERIMENT=jsonv2.
var moreDecoders []pointDecoder
