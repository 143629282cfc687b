package alert

import "github.com/fleetd/fleet"

// ReadRule is the typed decode of an alert rule as a client writes it (S2's
// body): every field's rules, and the condition and metadata filters
// compiled, with every problem recorded in f under its field's path. The
// API and the console both read rules here, so they accept the same rules
// and say the same of the others.
func ReadRule(f *fleet.Fields) *fleet.AlertRule {
	rule := &fleet.AlertRule{
		Name:                         f.NonEmptyString("name", true, 256),
		Group:                        f.String("group", false),
		MetadataFilters:              f.Object("metadata_filters", false),
		ActivationThresholdSeconds:   f.Float("activation_threshold_seconds", false, 0, fleet.MaxThresholdSeconds),
		DeactivationThresholdSeconds: f.Float("deactivation_threshold_seconds", false, 0, fleet.MaxThresholdSeconds),
	}
	if rule.Stream = f.String("stream", true); f.Has("stream") && !fleet.ValidStreamName(rule.Stream) {
		f.Fail("stream", fleet.StreamNameRule)
	}
	if len(rule.Group) > 256 {
		f.Fail("group", "must be at most 256 characters")
	}
	rule.Condition, _ = f.Value("condition", true)
	if f.Has("condition") || f.Has("metadata_filters") {
		if rule.Condition == nil {
			rule.Condition = map[string]any{} // reported as required already; compile the filters
		}
		for k, v := range CompileRule(rule) {
			if k != "condition" || f.Has("condition") {
				f.Fail(k, v)
			}
		}
	}
	return rule
}
