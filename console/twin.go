package console

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	fleethttp "github.com/fleetd/fleet/http"
)

// twinData is a device page's twin section (docs/twin.md): the shadow as
// read, and the desired state's form, as the shadow has it or as it was
// typed when it was refused.
type twinData struct {
	Shadow  *fleet.Shadow
	Desired string // the form's text: the whole desired state as JSON
	Version int64  // the version the form changes
	Error   string
	Fields  map[string]string
	typed   bool
}

// staleDesired is what a change made from an old version of the desired
// state is told: nothing is overwritten.
const staleDesired = "Someone changed the desired state since this page was read, so yours was not saved. " +
	"The state now is shown above; your text is kept below: check it against the new state and save again."

// readTwin fills d.Twin with the device's shadow, and the form with its
// desired state unless a refused edit's text is kept.
func (c *Console) readTwin(r *http.Request, tenant, id string, d *deviceData) error {
	sh, err := c.Shadows.FindShadow(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	d.Twin.Shadow, d.Twin.Version = sh, sh.Version
	if !d.Twin.typed {
		d.Twin.Desired = jsonText(sh.Desired)
	}
	return nil
}

// handleSetDesired saves the desired state typed as a whole document: the
// change is the merge patch from the version the page showed to the text
// (fleet.MergePatchFor), sent with that version, so a change someone made
// meanwhile is never overwritten (409, the form again with its text). A
// text the API would refuse shows the form again with the API's message.
func (c *Console) handleSetDesired(w http.ResponseWriter, r *http.Request, v *view) error {
	tenant, id := v.Actor.Tenant, r.PathValue("id")
	text := r.PostForm.Get("desired")
	d := deviceData{Twin: twinData{Desired: text, typed: true}}
	version, err := strconv.ParseInt(r.PostForm.Get("version"), 10, 64)
	if err != nil || version < 0 {
		return fleet.Errorf(fleet.EINVALID, "the form's version is not a version; reload the page")
	}
	err = c.setDesired(r, tenant, id, text, version)
	code := fleet.ErrorCode(err)
	switch code {
	case "":
		http.Redirect(w, r, "/console/devices/"+url.PathEscape(id)+"#twin", http.StatusSeeOther)
		return nil
	case fleet.ECONFLICT:
		d.Twin.Error = staleDesired
	case fleet.EINVALID, fleet.ETOOLARGE:
		d.Twin.Error, d.Twin.Fields = fleet.ErrorMessage(err), fieldsOf(err)
	default:
		return err
	}
	r.URL.RawQuery = ""
	d.Status = fleethttp.StatusOf(code)
	return c.renderDevice(w, r, v, d)
}

// setDesired changes the device's desired state from version to the
// document text.
func (c *Console) setDesired(r *http.Request, tenant, id, text string, version int64) error {
	doc, err := codec.Decode(codec.JSON, []byte(text))
	if err != nil {
		return fleet.FieldErrors(map[string]string{fleet.ShadowDesired: "must be a JSON object: " + fleet.ErrorMessage(err)})
	}
	f := fleet.NewFields(map[string]any{fleet.ShadowDesired: doc})
	to := f.Object(fleet.ShadowDesired, true)
	if err := f.Err(); err != nil {
		return err
	}
	sh, err := c.Shadows.FindShadow(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	if sh.Version != version {
		return fleet.Errorf(fleet.ECONFLICT, "the shadow is at version %d, not %d", sh.Version, version)
	}
	_, err = c.Shadows.UpdateDesired(r.Context(), tenant, id, fleet.MergePatchFor(sh.Desired, to), &version)
	return err
}

// groupForm is a group's form, as typed.
type groupForm struct {
	Name, Selector, Description string
}

// group reads the form as the API reads a group's body (fleet.ReadGroup).
func (f groupForm) group(withName bool) (*fleet.Group, error) {
	body := map[string]any{"selector": f.Selector, "description": f.Description}
	if withName {
		body["name"] = f.Name
	}
	fields := fleet.NewFields(body)
	g := fleet.ReadGroup(fields, withName)
	return g, fields.Err()
}

func readGroupForm(r *http.Request) groupForm {
	p := r.PostForm
	return groupForm{Name: p.Get("name"), Selector: p.Get("selector"), Description: p.Get("description")}
}

// groupsData is the groups page's.
type groupsData struct {
	Groups []*fleet.Group
	Pager  pager
	Form   groupForm // a new group
}

func (c *Console) handleGroups(w http.ResponseWriter, r *http.Request, v *view) error {
	return c.renderGroups(w, r, v, http.StatusOK, groupForm{})
}

func (c *Console) renderGroups(w http.ResponseWriter, r *http.Request, v *view, status int, f groupForm) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	d := groupsData{Form: f}
	var n int
	if d.Groups, n, err = c.Groups.FindGroups(r.Context(), v.Actor.Tenant, p); err != nil {
		return err
	}
	d.Pager = newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Groups", "groups", d
	c.render(w, r, status, "groups", v)
	return nil
}

// formRefused puts the API's message of a refused form on v and says the
// status to show the form again with; false when err is not the form's
// fault.
func formRefused(v *view, err error) (int, bool) {
	switch fleet.ErrorCode(err) {
	case fleet.EINVALID, fleet.ECONFLICT:
		v.Error, v.Fields = fleet.ErrorMessage(err), fieldsOf(err)
		return fleethttp.StatusOf(fleet.ErrorCode(err)), true
	}
	return 0, false
}

func (c *Console) handleCreateGroup(w http.ResponseWriter, r *http.Request, v *view) error {
	f := readGroupForm(r)
	g, err := f.group(true)
	if err == nil {
		g, err = c.Groups.CreateGroup(r.Context(), v.Actor.Tenant, g)
	}
	if err == nil {
		http.Redirect(w, r, "/console/groups/"+url.PathEscape(g.Name), http.StatusSeeOther)
		return nil
	}
	status, ok := formRefused(v, err)
	if !ok {
		return err
	}
	r.URL.RawQuery = ""
	return c.renderGroups(w, r, v, status, f)
}

// groupData is a group's page.
type groupData struct {
	Group   *fleet.Group
	Devices []deviceRow
	Pager   pager
	Form    groupForm // the edit
}

// pathGroup returns the {name} of the path; a name no group may have is
// not found.
func pathGroup(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !fleet.ValidGroupName(name) {
		return "", fleet.Errorf(fleet.ENOTFOUND, "group %q not found", name)
	}
	return name, nil
}

func (c *Console) handleGroup(w http.ResponseWriter, r *http.Request, v *view) error {
	return c.renderGroup(w, r, v, http.StatusOK, nil)
}

// renderGroup shows a group with its devices, and its edit form as the
// group has it or, when f is given, as typed.
func (c *Console) renderGroup(w http.ResponseWriter, r *http.Request, v *view, status int, f *groupForm) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	name, err := pathGroup(r)
	if err != nil {
		return err
	}
	p, err := readPage(r)
	if err != nil {
		return err
	}
	g, err := c.Groups.FindGroup(ctx, tenant, name)
	if err != nil {
		return err
	}
	devs, n, err := c.Groups.FindGroupDevices(ctx, tenant, name, p)
	if err != nil {
		return err
	}
	d := groupData{Group: g, Devices: c.deviceRows(tenant, devs), Pager: newPager(r, p, n),
		Form: groupForm{Name: g.Name, Selector: g.Selector, Description: g.Description}}
	if f != nil {
		d.Form = *f
	}
	v.Title, v.Nav, v.Data = "Group "+name, "groups", d
	c.render(w, r, status, "group", v)
	return nil
}

func (c *Console) handleUpdateGroup(w http.ResponseWriter, r *http.Request, v *view) error {
	name, err := pathGroup(r)
	if err != nil {
		return err
	}
	f := readGroupForm(r)
	f.Name = name
	g, err := f.group(false)
	if err == nil {
		_, err = c.Groups.UpdateGroup(r.Context(), v.Actor.Tenant, name, g)
	}
	if err == nil {
		http.Redirect(w, r, "/console/groups/"+url.PathEscape(name), http.StatusSeeOther)
		return nil
	}
	status, ok := formRefused(v, err)
	if !ok {
		return err
	}
	r.URL.RawQuery = ""
	return c.renderGroup(w, r, v, status, &f)
}

func (c *Console) handleDeleteGroup(w http.ResponseWriter, r *http.Request, v *view) error {
	name, err := pathGroup(r)
	if err != nil {
		return err
	}
	if err := c.Groups.DeleteGroup(r.Context(), v.Actor.Tenant, name); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/groups", http.StatusSeeOther)
	return nil
}
