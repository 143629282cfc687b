package ctl

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Markdown is the reference of every command of root, generated from the
// tree so that docs/cli.md cannot drift from the binary (a test compares
// them).
func Markdown(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString("# fleetctl reference\n\n")
	b.WriteString("<!-- Generated from fleetctl's command tree by `go test ./ctl -run TestCLIReference -update`; do not edit. -->\n\n")
	b.WriteString(root.Long + "\n\n")
	// The commands' help names the API's original endpoints by number.
	b.WriteString("S1 to S10 in the commands below are the ten original endpoints of the\nAPI ([docs/api.md](api.md#the-ten-original-endpoints-s1s10)).\n\n")
	b.WriteString("Flags of every command:\n\n```\n" + root.PersistentFlags().FlagUsages() + "```\n\n")
	b.WriteString("## Commands\n\n")
	var all []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" {
				continue
			}
			all = append(all, sub)
			walk(sub)
		}
	}
	walk(root)
	for _, c := range all {
		fmt.Fprintf(&b, "%s- [`%s`](#%s): %s\n", strings.Repeat("  ", depth(c)-1), c.CommandPath(), anchor(c), c.Short)
	}
	for _, c := range all {
		fmt.Fprintf(&b, "\n### %s\n\n%s.\n\n", c.CommandPath(), strings.TrimSuffix(c.Short, "."))
		b.WriteString("```\n" + c.UseLine() + "\n")
		if len(c.Aliases) > 0 {
			b.WriteString("aliases: " + strings.Join(c.Aliases, ", ") + "\n")
		}
		b.WriteString("```\n")
		if c.Long != "" {
			b.WriteString("\n```\n" + strings.TrimSpace(c.Long) + "\n```\n")
		}
		if c.Example != "" {
			b.WriteString("\nExamples:\n\n```sh\n" + c.Example + "\n```\n")
		}
		if f := c.LocalNonPersistentFlags().FlagUsages(); f != "" {
			b.WriteString("\nFlags:\n\n```\n" + f + "```\n")
		}
		if c.HasAvailableSubCommands() {
			b.WriteString("\nCommands:\n\n")
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() && sub.Name() != "help" {
					fmt.Fprintf(&b, "- [`%s`](#%s): %s\n", sub.CommandPath(), anchor(sub), sub.Short)
				}
			}
		}
	}
	return b.String()
}

func depth(c *cobra.Command) int {
	n := 0
	for p := c; p.HasParent(); p = p.Parent() {
		n++
	}
	return n
}

// anchor is the id GitHub gives the command's heading.
func anchor(c *cobra.Command) string {
	return strings.ReplaceAll(strings.ToLower(c.CommandPath()), " ", "-")
}
