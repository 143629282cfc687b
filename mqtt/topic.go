package mqtt

import (
	"regexp"
	"strings"

	"github.com/fleetd/fleet"
)

// The device topics of DESIGN §8. The leading slash is part of each name,
// exactly as the uplink agent builds them from its defaults.
const (
	topicPrefix     = "/tenants/"
	topicDevices    = "/devices/"
	topicActions    = "actions"
	topicStatus     = "action/status"
	topicEvents     = "events/"
	topicJSONArray  = "/jsonarray"
	topicReported   = "shadow/reported"
	topicDelta      = "shadow/delta"
	usernameDivider = "/"
)

// TopicKind says which of the device topics a topic name is.
type TopicKind int

// The kinds of device topic. Devices subscribe to TopicActions and
// TopicShadowDelta only, and publish to the others only.
const (
	TopicInvalid        TopicKind = iota
	TopicActions                  // /tenants/{t}/devices/{d}/actions
	TopicActionStatus             // /tenants/{t}/devices/{d}/action/status
	TopicStream                   // /tenants/{t}/devices/{d}/events/{stream}/jsonarray
	TopicShadowReported           // /tenants/{t}/devices/{d}/shadow/reported
	TopicShadowDelta              // /tenants/{t}/devices/{d}/shadow/delta
)

// Topic is a parsed device topic.
type Topic struct {
	Kind   TopicKind
	Tenant string
	Device string
	Stream string // for TopicStream only
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
	switch rest {
	case topicActions:
		t.Kind = TopicActions
	case topicStatus:
		t.Kind = TopicActionStatus
	case topicReported:
		t.Kind = TopicShadowReported
	case topicDelta:
		t.Kind = TopicShadowDelta
	default:
		rest, ok = strings.CutPrefix(rest, topicEvents)
		if !ok {
			return Topic{}, false
		}
		t.Stream, ok = strings.CutSuffix(rest, topicJSONArray)
		if !ok || !ValidStreamName(t.Stream) {
			return Topic{}, false
		}
		t.Kind = TopicStream
	}
	return t, true
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
	switch rest {
	case topicStatus:
		t.Kind = TopicActionStatus
		return t, true
	case topicReported:
		t.Kind = TopicShadowReported
		return t, true
	}
	if rest, ok = strings.CutPrefix(rest, topicEvents); !ok {
		return Topic{}, false
	}
	if t.Stream, ok = strings.CutSuffix(rest, topicJSONArray); !ok || !ValidStreamName(t.Stream) {
		return Topic{}, false
	}
	t.Kind = TopicStream
	return t, true
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

// StreamFilter: see StatusFilter.
func StreamFilter(group string) string {
	return "$share/" + group + "/" + topicPrefix + "+" + topicDevices + "+/" + topicEvents + "+" + topicJSONArray
}

// ReportedFilter: see StatusFilter.
func ReportedFilter(group string) string {
	return "$share/" + group + "/" + topicPrefix + "+" + topicDevices + "+/" + topicReported
}

// Username returns a device's MQTT username, "{tenant}/{device_id}", which
// ParseUsername splits.
func Username(tenant, device string) string { return tenant + usernameDivider + device }
