package fleet

import (
	"context"
	"time"
)

// Group is a saved selector (docs/twin.md): its devices are those the
// selector chooses at the moment it is read, so a device joins or leaves
// as its metadata or reported state changes.
type Group struct {
	Name        string    `json:"name"`
	Selector    string    `json:"selector"`
	Description string    `json:"description"`
	Count       int       `json:"count"` // devices in the group when it was read
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// ValidGroupName reports whether s may name a group.
func ValidGroupName(s string) bool { return validName(s, 64, "._-") }

// GroupNameRule says what a group name may be, for error messages.
const GroupNameRule = "must be 1 to 64 characters from A-Z a-z 0-9 . _ -"

// MaxGroupDescription bounds a group's description, in characters.
const MaxGroupDescription = 1024

// ReadGroup is the typed decode of a group: its name when withName (a
// new group; an existing one is named by its path), selector and
// description. The selector's grammar is checked where it is saved.
func ReadGroup(f *Fields, withName bool) *Group {
	g := &Group{Selector: f.String("selector", true), Description: f.String("description", false)}
	if withName {
		g.Name = f.String("name", true)
		if f.Has("name") && !ValidGroupName(g.Name) {
			f.Fail("name", GroupNameRule)
		}
	}
	if len([]rune(g.Description)) > MaxGroupDescription {
		f.Fail("description", "must be at most 1024 characters")
	} else if !PlainText(g.Description) {
		f.Fail("description", PlainTextRule)
	}
	return g
}

// GroupService keeps a tenant's groups.
type GroupService interface {
	// CreateGroup saves g; a name taken already is ECONFLICT. The selector
	// is kept as Selector.String writes it.
	CreateGroup(ctx context.Context, tenant string, g *Group) (*Group, error)
	FindGroup(ctx context.Context, tenant, name string) (*Group, error)
	// FindGroups lists the groups by name, each with its count.
	FindGroups(ctx context.Context, tenant string, p Page) ([]*Group, int, error)
	// UpdateGroup replaces the selector and description of a group.
	UpdateGroup(ctx context.Context, tenant, name string, g *Group) (*Group, error)
	DeleteGroup(ctx context.Context, tenant, name string) error
	// FindGroupDevices lists the devices the group's selector chooses
	// now, by id, and counts them.
	FindGroupDevices(ctx context.Context, tenant, name string, p Page) ([]*Device, int, error)
}
