package fleet

import (
	"context"
	"fmt"
	"net/mail"
	"net/url"
	"strings"
	"time"
)

// ReadNotificationRule is the typed decode of a notification rule as a
// client writes it (S3's body), its template rendered for a sample alert
// within lim. The API and the console both read notification rules here.
func ReadNotificationRule(ctx context.Context, f *Fields, lim TemplateLimits) *NotificationRule {
	n := &NotificationRule{Timezone: "UTC", NotificationTemplate: DefaultNotificationTemplate}
	if cf := f.Nested("channel_parameters", true); cf != nil {
		n.ChannelParameters, _ = ReadChannel(cf)
	}
	n.IntervalSeconds = f.Int("interval_seconds", false, 0, MaxThresholdSeconds)
	if t := readNotificationTemplate(ctx, f, lim); t != nil {
		n.NotificationTemplate = *t
	}
	if tz := ReadTimezone(f); tz != nil {
		n.Timezone = *tz
	}
	return n
}

// ReadNotificationRuleUpdate is the typed decode of S4's body: every
// field optional.
func ReadNotificationRuleUpdate(ctx context.Context, f *Fields, lim TemplateLimits) NotificationRuleUpdate {
	var u NotificationRuleUpdate
	if cf := f.Nested("channel_parameters", false); cf != nil {
		c, given := ReadChannel(cf)
		u.ChannelParameters, u.SecretGiven = &c, given
	}
	if f.Has("interval_seconds") {
		n := f.Int("interval_seconds", false, 0, MaxThresholdSeconds)
		u.IntervalSeconds = &n
	}
	u.NotificationTemplate = readNotificationTemplate(ctx, f, lim)
	u.Timezone = ReadTimezone(f)
	return u
}

// ReadChannel is the typed decode of channel_parameters, of alert and
// rollout notification rules. secretGiven says whether a secret was sent.
func ReadChannel(f *Fields) (c ChannelParameters, secretGiven bool) {
	c.Type = f.String("type", true)
	switch c.Type {
	case ChannelWebhook, ChannelSlack:
		c.URL = f.String("url", true)
		if f.Has("url") {
			if problem := checkURL(c.URL); problem != "" {
				f.Fail("url", problem)
			}
		}
	case ChannelEmail:
		c.To = f.Strings("to", true)
		if f.Has("to") {
			if len(c.To) == 0 || len(c.To) > 50 {
				f.Fail("to", "must list 1 to 50 email addresses")
			}
			for i, a := range c.To {
				if addr, err := mail.ParseAddress(a); err != nil || addr.Name != "" || len(a) > 254 {
					f.Fail(fmt.Sprintf("to[%d]", i), "must be an email address such as ops@example.com")
				}
			}
		}
	case "":
	default:
		f.Fail("type", "must be webhook, slack or email")
	}
	if c.Type == ChannelWebhook {
		c.Headers = f.StringMap("headers", false)
		if len(c.Headers) > 32 {
			f.Fail("headers", "must have at most 32 headers")
		}
		for k, v := range c.Headers {
			if problem := checkHeader(k, v); problem != "" {
				f.Fail("headers."+k, problem)
			}
		}
		secretGiven = f.Has("secret")
		if c.Secret = f.String("secret", false); len(c.Secret) > 256 {
			f.Fail("secret", "must be at most 256 characters")
		}
	}
	f.Unknown()
	return c, secretGiven
}

// checkURL returns the problem with a notification URL, or "".
func checkURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(s) > 2048 {
		return "must be an absolute http or https URL of at most 2048 characters"
	}
	return ""
}

// checkHeader returns the problem with a webhook header, or "". Headers that
// fleetd sets itself cannot be replaced.
func checkHeader(name, value string) string {
	if name == "" || len(name) > 128 || strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, r)
	}) {
		return "is not a valid header name"
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "content-type", "transfer-encoding", "connection":
		return "is set by fleetd"
	}
	if strings.HasPrefix(strings.ToLower(name), "x-fleet-") {
		return "is set by fleetd"
	}
	if len(value) > 4096 || strings.ContainsAny(value, "\r\n\x00") {
		return "must be at most 4096 characters on one line"
	}
	return ""
}

// readNotificationTemplate reads notification_template, rendered for a
// sample alert within lim.
func readNotificationTemplate(ctx context.Context, f *Fields, lim TemplateLimits) *NotificationTemplate {
	tf := f.Nested("notification_template", false)
	if tf == nil {
		return nil
	}
	t := &NotificationTemplate{Subject: tf.String("subject", false), Body: tf.String("body", false)}
	tf.Unknown()
	for k, v := range CheckNotificationTemplate(ctx, lim, *t) {
		f.Fail(k, v)
	}
	return t
}

// ReadTimezone reads timezone, an IANA name; nil when absent.
func ReadTimezone(f *Fields) *string {
	if !f.Has("timezone") {
		return nil
	}
	tz := f.String("timezone", false)
	if _, err := time.LoadLocation(tz); err != nil || tz == "" || tz == "Local" {
		f.Fail("timezone", "must be an IANA time zone name such as UTC or Europe/Berlin")
	}
	return &tz
}
