package mqtt

import (
	"regexp"
	"strings"

	"github.com/fleetd/fleet"
)

// The device topics of docs/device-protocol.md#topics. The leading slash is
// part of each name, exactly as the uplink agent builds them from its
// defaults.
const (
	topicPrefix     = "/tenants/"
	topicDevices    = "/devices/"
	topicActions    = "actions"
	topicStatus     = "action/status"
	topicEvents     = "events/"
	topicJSONArray  = "/jsonarray"
	topicReported   = "shadow/reported"
	topicDelta      = "shadow/delta"
	topicLZ4        = "/lz4"
	usernameDivider = "/"
)

// Compression is how a stream topic's payload is compressed.
type Compression string

// The compressions of stream topics: none, or an LZ4 frame, which the
// uplink agent publishes on …/jsonarray/lz4 for a stream configured with
// compression = "Lz4".
const (
	CompressionNone Compression = ""
	CompressionLZ4  Compression = "lz4"
)

// TopicKind says which of the device topics a topic name is.
type TopicKind int

// The kinds of device topic. Devices subscribe to TopicActions and
// TopicShadowDelta only, and publish to the others only.
const (
	TopicInvalid      TopicKind = iota
	TopicActions                // /tenants/{t}/devices/{d}/actions
	TopicActionStatus           // /tenants/{t}/devices/{d}/action/status
	// TopicStream: /tenants/{t}/devices/{d}/events/{stream}/jsonarray, with
	// /lz4 after it for an LZ4 frame; older uplink agents publish their
	// own statistics without events/ (…/{d}/uplink_disk_stats/jsonarray).
	TopicStream
	TopicShadowReported // /tenants/{t}/devices/{d}/shadow/reported
	TopicShadowDelta    // /tenants/{t}/devices/{d}/shadow/delta
)

// Topic is a parsed device topic.
type Topic struct {
	Kind        TopicKind
	Tenant      string
	Device      string
	Stream      string      // for TopicStream only
	Compression Compression // for TopicStream only
}

// ActionsTopic returns the topic on which fleetd sends a device its actions.
func ActionsTopic(tenant, device string) string {
	return topicPrefix + tenant + topicDevices + device + "/" + topicActions
}

// ActionStatusTopic returns the topic on which a device reports the progress
// of its actions.
func ActionStatusTopic(tenant, device string) string {
	return topicPrefix + tenant + topicDevices + device + "/" + topicStatus
}

// StreamTopic returns the topic on which a device publishes data points of a
// stream.
func StreamTopic(tenant, device, stream string) string {
	return topicPrefix + tenant + topicDevices + device + "/" + topicEvents + stream + topicJSONArray
}

// ShadowReportedTopic returns the topic on which a device publishes its
// reported state, as a JSON merge patch (docs/twin.md).
func ShadowReportedTopic(tenant, device string) string {
	return topicPrefix + tenant + topicDevices + device + "/" + topicReported
}

// ShadowDeltaTopic returns the topic on which fleetd sends a device the
// delta of its shadow.
func ShadowDeltaTopic(tenant, device string) string {
	return topicPrefix + tenant + topicDevices + device + "/" + topicDelta
}

var streamName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidStreamName reports whether s may name a data stream: 1 to 128
// characters from A-Z a-z 0-9 . _ -. The rule keeps a stream name one topic
// level without wildcards.
func ValidStreamName(s string) bool { return streamName.MatchString(s) }

// ParseTopic parses a topic name into a device topic. It reports false for
// anything else, wildcards and $SYS included, since no tenant or device name
// may contain '+', '#' or '/'.
func ParseTopic(name string) (Topic, bool) {
	rest, ok := strings.CutPrefix(name, topicPrefix)
	if !ok {
		return Topic{}, false
	}
	tenant, rest, ok := strings.Cut(rest, "/")
	if !ok || !fleet.ValidTenantName(tenant) {
		return Topic{}, false
	}
	rest, ok = strings.CutPrefix(rest, topicDevices[1:])
	if !ok {
		return Topic{}, false
	}
	device, rest, ok := strings.Cut(rest, "/")
	if !ok || !fleet.ValidDeviceID(device) {
		return Topic{}, false
	}
	t := Topic{Tenant: tenant, Device: device}
	if rest == topicActions {
		t.Kind = TopicActions
		return t, true
	}
	if rest == topicDelta {
		t.Kind = TopicShadowDelta
		return t, true
	}
	if !t.parsePublished(rest) {
		return Topic{}, false
	}
	return t, true
}

// parsePublished sets t's kind (and stream) from rest, what follows
// "/tenants/{t}/devices/{d}/" in a topic a device publishes on, and
// reports whether it is one.
func (t *Topic) parsePublished(rest string) bool {
	switch rest {
	case topicStatus:
		t.Kind = TopicActionStatus
		return true
	case topicReported:
		t.Kind = TopicShadowReported
		return true
	}
	if r, ok := strings.CutSuffix(rest, topicLZ4); ok {
		rest, t.Compression = r, CompressionLZ4
	}
	rest, ok := strings.CutSuffix(rest, topicJSONArray)
	if !ok {
		return false
	}
	// events/{stream}, or an older uplink's {stream} alone.
	if r, ok := strings.CutPrefix(rest, topicEvents); ok {
		rest = r
	} else if rest+"/" == topicEvents {
		return false
	}
	if !ValidStreamName(rest) {
		return false
	}
	t.Kind, t.Stream = TopicStream, rest
	return true
}

// ParseUsername splits a device's MQTT username, "{tenant}/{device_id}", into
// its valid parts, and reports false for anything else.
func ParseUsername(username string) (tenant, device string, ok bool) {
	tenant, device, ok = strings.Cut(username, usernameDivider)
	if !ok || !fleet.ValidTenantName(tenant) || !fleet.ValidDeviceID(device) {
		return "", "", false
	}
	return tenant, device, true
}

// MayPublish reports whether the device may publish on topic: its own
// status, stream and reported-state topics, nothing else. It is called for every publish, so it
// matches the device's own topics spelled out rather than parse and
// validate the names the session has already checked.
func MayPublish(tenant, device, topic string) (Topic, bool) {
	rest, ok := strings.CutPrefix(topic, topicPrefix)
	if !ok {
		return Topic{}, false
	}
	if rest, ok = strings.CutPrefix(rest, tenant); !ok {
		return Topic{}, false
	}
	if rest, ok = strings.CutPrefix(rest, topicDevices); !ok {
		return Topic{}, false
	}
	if rest, ok = strings.CutPrefix(rest, device); !ok {
		return Topic{}, false
	}
	if rest, ok = strings.CutPrefix(rest, "/"); !ok {
		return Topic{}, false
	}
	t := Topic{Tenant: tenant, Device: device}
	if !t.parsePublished(rest) {
		return Topic{}, false
	}
	return t, true
}

// OwnTopic reports whether topic is under the device's own prefix,
// /tenants/{t}/devices/{d}/: a publish there that is not one of its
// topics (MayPublish) is refused, the connection kept; one elsewhere is
// another device's or tenant's.
func OwnTopic(tenant, device, topic string) bool {
	return strings.HasPrefix(topic, topicPrefix+tenant+topicDevices+device+"/")
}

// MaySubscribe reports whether the device may subscribe to filter: its own
// actions or shadow delta topic, spelled out, nothing else.
func MaySubscribe(tenant, device, filter string) bool {
	return SubscriptionOf(tenant, device, filter) != TopicInvalid
}

// SubscriptionOf returns which of the device's topics filter is:
// TopicActions, TopicShadowDelta, or TopicInvalid for any other filter.
func SubscriptionOf(tenant, device, filter string) TopicKind {
	switch filter {
	case ActionsTopic(tenant, device):
		return TopicActions
	case ShadowDeltaTopic(tenant, device):
		return TopicShadowDelta
	}
	return TopicInvalid
}

// StatusFilter and StreamFilter are the shared subscriptions through which
// the replicas of group split the devices' publishes. The device topics
// start with "/", so an empty level follows the group name.
func StatusFilter(group string) string {
	return "$share/" + group + "/" + topicPrefix + "+" + topicDevices + "+/" + topicStatus
}

// StreamFilters: see StatusFilter; one filter for each form of stream
// topic.
func StreamFilters(group string) []string {
	devices := "$share/" + group + "/" + topicPrefix + "+" + topicDevices + "+/"
	return []string{devices + topicEvents + "+" + topicJSONArray, devices + topicEvents + "+" + topicJSONArray + topicLZ4,
		devices + "+" + topicJSONArray, devices + "+" + topicJSONArray + topicLZ4}
}

// ReportedFilter: see StatusFilter.
func ReportedFilter(group string) string {
	return "$share/" + group + "/" + topicPrefix + "+" + topicDevices + "+/" + topicReported
}

// Username returns a device's MQTT username, "{tenant}/{device_id}", which
// ParseUsername splits.
func Username(tenant, device string) string { return tenant + usernameDivider + device }
