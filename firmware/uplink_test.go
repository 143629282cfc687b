package firmware_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
)

// uplinkDownloadFile is what the uplink agent's downloader reads from an
// update_firmware payload (uplink/src/collector/downloader.rs, DownloadFile):
//
//	url: String,
//	#[serde(alias = "content-length")] content_length: usize,
//	#[serde(alias = "version")] file_name: String,
//	download_path: Option<PathBuf>,
//	checksum: Option<String>,
type uplinkDownloadFile struct {
	URL           string
	ContentLength uint64
	FileName      string
	DownloadPath  *string
	Checksum      *string
}

// decodeAsUplink decodes payload by serde_json's rules for that struct: a
// field given twice, under its name or an alias, is an error ("duplicate
// field"); a required field missing is an error; Option fields may be
// missing or null; unknown fields are skipped; String takes only a string
// and usize only a non-negative integer literal.
func decodeAsUplink(payload []byte) (uplinkDownloadFile, error) {
	var d uplinkDownloadFile
	names := map[string]string{
		"url": "url", "content_length": "content_length", "content-length": "content_length",
		"file_name": "file_name", "version": "file_name", "download_path": "download_path", "checksum": "checksum",
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return d, fmt.Errorf("invalid type: expected struct DownloadFile")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return d, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return d, err
		}
		field, known := names[tok.(string)]
		if !known {
			continue
		}
		if seen[field] {
			return d, fmt.Errorf("duplicate field `%s`", field)
		}
		seen[field] = true
		str := func(optional bool) (*string, error) {
			if optional && string(raw) == "null" {
				return nil, nil
			}
			if len(raw) == 0 || raw[0] != '"' {
				return nil, fmt.Errorf("invalid type for `%s`: %s, expected a string", field, raw)
			}
			var s string
			err := json.Unmarshal(raw, &s)
			return &s, err
		}
		switch field {
		case "url", "file_name":
			s, err := str(false)
			if err != nil {
				return d, err
			}
			if field == "url" {
				d.URL = *s
			} else {
				d.FileName = *s
			}
		case "download_path":
			if d.DownloadPath, err = str(true); err != nil {
				return d, err
			}
		case "checksum":
			if d.Checksum, err = str(true); err != nil {
				return d, err
			}
		case "content_length":
			if d.ContentLength, err = strconv.ParseUint(string(raw), 10, 64); err != nil {
				return d, fmt.Errorf("invalid type for `content_length`: %s, expected usize", raw)
			}
		}
	}
	for _, f := range []string{"url", "content_length", "file_name"} {
		if !seen[f] {
			return d, fmt.Errorf("missing field `%s`", f)
		}
	}
	return d, nil
}

func TestDecodeAsUplink(t *testing.T) {
	for payload, want := range map[string]string{
		`{"url": "u", "content-length": 1, "version": "1.0"}`:                                       "",
		`{"url": "u", "content_length": 1, "file_name": "f", "checksum": null, "x": [1, {"y": 2}]}`: "",
		`{"url": "u", "content-length": 1, "version": "1.0", "file_name": "f"}`:                     "duplicate field `file_name`",
		`{"url": "u", "content-length": 1, "content_length": 1, "version": "1.0"}`:                  "duplicate field `content_length`",
		`{"url": "u", "url": "v", "content-length": 1, "version": "1.0"}`:                           "duplicate field `url`",
		`{"url": "u", "version": "1.0"}`:                                                            "missing field `content_length`",
		`{"url": "u", "content-length": -1, "version": "1.0"}`:                                      "invalid type for `content_length`: -1, expected usize",
		`{"url": "u", "content-length": 1.5, "version": "1.0"}`:                                     "invalid type for `content_length`: 1.5, expected usize",
		`{"url": "u", "content-length": 1, "version": 1}`:                                           "invalid type for `file_name`: 1, expected a string",
		`[]`: "invalid type: expected struct DownloadFile",
	} {
		_, err := decodeAsUplink([]byte(payload))
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Errorf("%s: %v, want %q", payload, err, want)
		}
	}
}
