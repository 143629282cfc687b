package mqtt_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/mqtt"
)

func TestTopicBuilders(t *testing.T) {
	for _, tt := range []struct {
		name, got, want string
	}{
		{"actions", mqtt.ActionsTopic("acme", "dev-1"), "/tenants/acme/devices/dev-1/actions"},
		{"status", mqtt.ActionStatusTopic("acme", "dev-1"), "/tenants/acme/devices/dev-1/action/status"},
		{"stream", mqtt.StreamTopic("acme", "dev-1", "gps"), "/tenants/acme/devices/dev-1/events/gps/jsonarray"},
		{"reported", mqtt.ShadowReportedTopic("acme", "dev-1"), "/tenants/acme/devices/dev-1/shadow/reported"},
		{"delta", mqtt.ShadowDeltaTopic("acme", "dev-1"), "/tenants/acme/devices/dev-1/shadow/delta"},
		{"reported filter", mqtt.ReportedFilter("fleetd"), "$share/fleetd//tenants/+/devices/+/shadow/reported"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

func TestParseTopic(t *testing.T) {
	long := strings.Repeat("d", 128)
	for _, tt := range []struct {
		topic string
		want  mqtt.Topic
		ok    bool
	}{
		{"/tenants/acme/devices/dev-1/actions", mqtt.Topic{Kind: mqtt.TopicActions, Tenant: "acme", Device: "dev-1"}, true},
		{"/tenants/acme/devices/dev-1/action/status", mqtt.Topic{Kind: mqtt.TopicActionStatus, Tenant: "acme", Device: "dev-1"}, true},
		{"/tenants/acme/devices/dev-1/events/gps/jsonarray", mqtt.Topic{Kind: mqtt.TopicStream, Tenant: "acme", Device: "dev-1", Stream: "gps"}, true},
		{"/tenants/acme/devices/dev-1/shadow/reported", mqtt.Topic{Kind: mqtt.TopicShadowReported, Tenant: "acme", Device: "dev-1"}, true},
		{"/tenants/acme/devices/dev-1/shadow/delta", mqtt.Topic{Kind: mqtt.TopicShadowDelta, Tenant: "acme", Device: "dev-1"}, true},
		{"/tenants/acme/devices/dev-1/shadow", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/shadow/desired", mqtt.Topic{}, false},
		{"/tenants/a-1/devices/A.b_c:d-9/events/uplink_stream_metrics/jsonarray", mqtt.Topic{Kind: mqtt.TopicStream, Tenant: "a-1", Device: "A.b_c:d-9", Stream: "uplink_stream_metrics"}, true},
		{"/tenants/acme/devices/" + long + "/actions", mqtt.Topic{Kind: mqtt.TopicActions, Tenant: "acme", Device: long}, true},
		// An LZ4 frame; an older uplink's statistics, without events/.
		{"/tenants/acme/devices/dev-1/events/gps/jsonarray/lz4", mqtt.Topic{Kind: mqtt.TopicStream, Tenant: "acme", Device: "dev-1", Stream: "gps", Compression: mqtt.CompressionLZ4}, true},
		{"/tenants/acme/devices/dev-1/uplink_disk_stats/jsonarray", mqtt.Topic{Kind: mqtt.TopicStream, Tenant: "acme", Device: "dev-1", Stream: "uplink_disk_stats"}, true},
		{"/tenants/acme/devices/dev-1/uplink_disk_stats/jsonarray/lz4", mqtt.Topic{Kind: mqtt.TopicStream, Tenant: "acme", Device: "dev-1", Stream: "uplink_disk_stats", Compression: mqtt.CompressionLZ4}, true},
		{"/tenants/acme/devices/dev-1/events/gps/jsonarray/gzip", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/gps/lz4", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/jsonarray", mqtt.Topic{}, false},

		{"", mqtt.Topic{}, false},
		{"#", mqtt.Topic{}, false},
		{"$SYS/broker/uptime", mqtt.Topic{}, false},
		{"tenants/acme/devices/dev-1/actions", mqtt.Topic{}, false},          // no leading slash
		{"/tenants/acme/devices/dev-1/actions/", mqtt.Topic{}, false},        // trailing slash
		{"/tenants/acme/devices/dev-1/action/status/x", mqtt.Topic{}, false}, // extra level
		{"/tenants/acme/devices/dev-1", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/", mqtt.Topic{}, false},
		{"/tenants/acme/devices//actions", mqtt.Topic{}, false},
		{"/tenants//devices/dev-1/actions", mqtt.Topic{}, false},
		{"/tenants/Acme/devices/dev-1/actions", mqtt.Topic{}, false}, // tenant names are lower case
		{"/tenants/+/devices/dev-1/actions", mqtt.Topic{}, false},
		{"/tenants/acme/devices/+/actions", mqtt.Topic{}, false},
		{"/tenants/acme/devices/#", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev 1/actions", mqtt.Topic{}, false},
		{"/tenants/acme/devices/" + long + "d/actions", mqtt.Topic{}, false},
		{"/tenants/acme/things/dev-1/actions", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/gps", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/jsonarray", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events//jsonarray", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/+/jsonarray", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/a/b/jsonarray", mqtt.Topic{}, false},
		{"/tenants/acme/devices/dev-1/events/gps/json", mqtt.Topic{}, false},
		{"$share/fleetd/tenants/acme/devices/dev-1/action/status", mqtt.Topic{}, false},
	} {
		t.Run(tt.topic, func(t *testing.T) {
			got, ok := mqtt.ParseTopic(tt.topic)
			if ok != tt.ok || got != tt.want {
				t.Errorf("ParseTopic(%q) = %+v, %v; want %+v, %v", tt.topic, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestParseTopicRoundTrip(t *testing.T) {
	for _, topic := range []string{
		mqtt.ActionsTopic("t", "d"),
		mqtt.ActionStatusTopic("t", "d"),
		mqtt.StreamTopic("t", "d", "s"),
		mqtt.ShadowReportedTopic("t", "d"),
		mqtt.ShadowDeltaTopic("t", "d"),
	} {
		got, ok := mqtt.ParseTopic(topic)
		if !ok || got.Tenant != "t" || got.Device != "d" {
			t.Errorf("ParseTopic(%q) = %+v, %v", topic, got, ok)
		}
	}
}

func TestParseUsername(t *testing.T) {
	for _, tt := range []struct {
		username       string
		tenant, device string
		ok             bool
	}{
		{"acme/dev-1", "acme", "dev-1", true},
		{"a/B.c_d:e-1", "a", "B.c_d:e-1", true},
		{"", "", "", false},
		{"acme", "", "", false},
		{"acme/", "", "", false},
		{"/dev-1", "", "", false},
		{"acme/dev/1", "", "", false},
		{"Acme/dev-1", "", "", false},
		{"acme/dev 1", "", "", false},
		{"acme/+", "", "", false},
		{strings.Repeat("a", 64) + "/dev", "", "", false},
	} {
		t.Run(tt.username, func(t *testing.T) {
			tenant, device, ok := mqtt.ParseUsername(tt.username)
			if tenant != tt.tenant || device != tt.device || ok != tt.ok {
				t.Errorf("ParseUsername(%q) = %q, %q, %v; want %q, %q, %v",
					tt.username, tenant, device, ok, tt.tenant, tt.device, tt.ok)
			}
		})
	}
}

func TestValidStreamName(t *testing.T) {
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"gps", true},
		{"device_shadow", true},
		{"a.b-c_D9", true},
		{strings.Repeat("s", 128), true},
		{"", false},
		{strings.Repeat("s", 129), false},
		{"a/b", false},
		{"+", false},
		{"#", false},
		{"a b", false},
	} {
		if got := mqtt.ValidStreamName(tt.name); got != tt.ok {
			t.Errorf("ValidStreamName(%q) = %v, want %v", tt.name, got, tt.ok)
		}
	}
}

// TestDeviceTopicRights: a device publishes its reported state and
// subscribes to its delta, and touches no other device's.
func TestDeviceTopicRights(t *testing.T) {
	if _, ok := mqtt.MayPublish("acme", "dev-1", mqtt.ShadowReportedTopic("acme", "dev-1")); !ok {
		t.Error("a device may not publish its reported state")
	}
	for _, topic := range []string{mqtt.ShadowDeltaTopic("acme", "dev-1"), mqtt.ShadowReportedTopic("acme", "dev-2"), mqtt.ActionsTopic("acme", "dev-1")} {
		if _, ok := mqtt.MayPublish("acme", "dev-1", topic); ok {
			t.Errorf("a device may publish on %s", topic)
		}
	}
	for _, tt := range []struct {
		filter string
		want   mqtt.TopicKind
	}{
		{mqtt.ActionsTopic("acme", "dev-1"), mqtt.TopicActions},
		{mqtt.ShadowDeltaTopic("acme", "dev-1"), mqtt.TopicShadowDelta},
		{mqtt.ShadowDeltaTopic("acme", "dev-2"), mqtt.TopicInvalid},
		{mqtt.ShadowReportedTopic("acme", "dev-1"), mqtt.TopicInvalid},
		{"/tenants/acme/devices/dev-1/shadow/+", mqtt.TopicInvalid},
	} {
		if got := mqtt.SubscriptionOf("acme", "dev-1", tt.filter); got != tt.want {
			t.Errorf("SubscriptionOf(%s) = %v, want %v", tt.filter, got, tt.want)
		}
	}
}
