package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

var _ fleet.FirmwareStore = (*DB)(nil)

const bundleColumns = `id, version, file_name, upload_status, upload_error, blob_key, content_length,
	uncompressed_size, checksum, components, declared_content_length, declared_uncompressed_size,
	declared_checksum, created_at, updated_at`

// storedComponent is one parsed manifest entry, kept in firmware_bundles.components
// until the bundle is completed.
type storedComponent struct {
	ComponentName    string             `json:"component_name"`
	VersionNumber    string             `json:"version_number"`
	FileName         string             `json:"file_name"`
	Checksum         string             `json:"checksum"`
	ContentLength    int64              `json:"content_length"`
	UncompressedSize int64              `json:"uncompressed_size"`
	Dependencies     []fleet.Dependency `json:"dependencies"`
	MD5              string             `json:"md5,omitempty"`
	SHA1             string             `json:"sha1,omitempty"`
}

func encodeComponents(cs []*fleet.Firmware) string {
	out := make([]storedComponent, len(cs))
	for i, c := range cs {
		out[i] = storedComponent{c.ComponentName, c.VersionNumber, c.FileName, c.Checksum, c.ContentLength, c.UncompressedSize, depsOrEmpty(c.Dependencies), c.MD5, c.SHA1}
	}
	b, _ := json.Marshal(out) // plain data always encodes
	return string(b)
}

func decodeComponents(s string) ([]*fleet.Firmware, error) {
	var in []storedComponent
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, err
	}
	out := make([]*fleet.Firmware, len(in))
	for i, c := range in {
		out[i] = &fleet.Firmware{ComponentName: c.ComponentName, VersionNumber: c.VersionNumber, FileName: c.FileName,
			Checksum: c.Checksum, ContentLength: c.ContentLength, UncompressedSize: c.UncompressedSize, Dependencies: depsOrEmpty(c.Dependencies),
			MD5: c.MD5, SHA1: c.SHA1}
	}
	return out, nil
}

func depsOrEmpty(d []fleet.Dependency) []fleet.Dependency {
	if d == nil {
		return []fleet.Dependency{}
	}
	return d
}

// bundleRow is a bundle as stored, with its parsed components.
type bundleRow struct {
	*fleet.Bundle
	components []*fleet.Firmware
}

func scanBundle(s scanner) (*bundleRow, error) {
	b := &fleet.Bundle{Firmwares: []*fleet.Firmware{}}
	var id string
	var blobKey, checksum, comps, dChecksum sql.NullString
	var length, size, dLength, dSize sql.NullInt64
	var created, updated int64
	if err := s.Scan(&id, &b.Version, &b.FileName, &b.UploadStatus, &b.UploadError, &blobKey, &length, &size,
		&checksum, &comps, &dLength, &dSize, &dChecksum, &created, &updated); err != nil {
		return nil, err
	}
	var err error
	if b.ID, err = uuid.Parse(id); err != nil {
		return nil, fmt.Errorf("bundle id %q: %w", id, err)
	}
	b.BlobKey = blobKey.String
	if length.Valid {
		b.ContentLength, b.UncompressedSize, b.Checksum = &length.Int64, &size.Int64, &checksum.String
	}
	if dChecksum.Valid {
		b.Declared = &fleet.Declaration{ContentLength: dLength.Int64, UncompressedSize: dSize.Int64, Checksum: dChecksum.String}
	}
	b.CreatedAt, b.UpdatedAt = fromMillis(created), fromMillis(updated)
	row := &bundleRow{Bundle: b}
	if comps.Valid && comps.String != "" {
		if row.components, err = decodeComponents(comps.String); err != nil {
			return nil, fmt.Errorf("bundle %s components: %w", id, err)
		}
	}
	return row, nil
}

func bundleNotFound(id uuid.UUID) error {
	return fleet.Errorf(fleet.ENOTFOUND, "firmware bundle %s not found", id)
}

// bundle reads one bundle inside a write transaction.
func (tx *Tx) bundle(ctx context.Context, tenant string, id uuid.UUID) (*bundleRow, error) {
	row, err := scanBundle(tx.queryRow(ctx, "SELECT "+bundleColumns+" FROM firmware_bundles WHERE tenant = ? AND id = ?", tenant, id.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, bundleNotFound(id)
	}
	return row, err
}

// CreatePendingBundle stores a record that awaits its archive.
func (db *DB) CreatePendingBundle(ctx context.Context, tenant string, b *fleet.Bundle) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		now := millis(tx.now)
		_, err := tx.exec(ctx, `INSERT INTO firmware_bundles (tenant, id, version, file_name, upload_status, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, tenant, b.ID.String(), b.Version, b.FileName, fleet.UploadPending, now, now)
		if isUniqueViolation(err) {
			return fleet.Errorf(fleet.ECONFLICT, "firmware bundle version %s exists already", b.Version)
		} else if err != nil {
			return err
		}
		b.UploadStatus = fleet.UploadPending
		b.CreatedAt, b.UpdatedAt = fromMillis(now), fromMillis(now)
		b.Firmwares = []*fleet.Firmware{}
		return tx.audit(ctx, tenant, "firmware_bundle.create", "firmware-bundles/"+b.ID.String(),
			map[string]any{"version": b.Version, "file_name": b.FileName, "upload_status": fleet.UploadPending})
	})
}

// CreateBundle stores a completed bundle and its component versions.
func (db *DB) CreateBundle(ctx context.Context, tenant string, b *fleet.Bundle, f *fleet.BundleFile) error {
	var out *fleet.Bundle
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		now := millis(tx.now)
		_, err := tx.exec(ctx, `INSERT INTO firmware_bundles (tenant, id, version, file_name, upload_status, blob_key,
			content_length, uncompressed_size, checksum, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			tenant, b.ID.String(), b.Version, b.FileName, fleet.UploadCompleted, f.BlobKey,
			f.ContentLength, f.UncompressedSize, f.Checksum, now, now)
		if isUniqueViolation(err) {
			return fleet.Errorf(fleet.ECONFLICT, "firmware bundle version %s exists already", b.Version)
		} else if err != nil {
			return err
		}
		if err := tx.checkComponents(ctx, tenant, f.Manifest.Components); err != nil {
			return err
		}
		if err := tx.linkFirmwares(ctx, tenant, b.ID, f.Manifest.Components); err != nil {
			return err
		}
		if err := tx.audit(ctx, tenant, "firmware_bundle.create", "firmware-bundles/"+b.ID.String(), map[string]any{
			"version": b.Version, "file_name": b.FileName, "upload_status": fleet.UploadCompleted,
			"checksum": f.Checksum, "content_length": f.ContentLength,
		}); err != nil {
			return err
		}
		row, err := tx.bundle(ctx, tenant, b.ID)
		if err != nil {
			return err
		}
		if row.Firmwares, err = tx.bundleFirmwares(ctx, tenant, b.ID); err != nil {
			return err
		}
		out = row.Bundle
		return nil
	})
	if err == nil {
		*b = *out
	}
	return err
}

// checkComponents refuses component versions stored already with another
// checksum: the same version of a component is one file.
func (tx *Tx) checkComponents(ctx context.Context, tenant string, cs []*fleet.Firmware) error {
	for _, c := range cs {
		var checksum string
		err := tx.queryRow(ctx, "SELECT checksum FROM firmwares WHERE tenant = ? AND component_name = ? AND version_number = ?",
			tenant, c.ComponentName, c.VersionNumber).Scan(&checksum)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		} else if err != nil {
			return err
		}
		if checksum != c.Checksum {
			return componentConflict(c, checksum)
		}
	}
	return nil
}

func componentConflict(c *fleet.Firmware, stored string) *fleet.Error {
	return &fleet.Error{Code: fleet.ECONFLICT,
		Message: fmt.Sprintf("component %s version %s exists already with another checksum (%s, this bundle's is %s); give the changed file a new version number",
			c.ComponentName, c.VersionNumber, stored, c.Checksum),
		Fields: map[string]string{"components": c.ComponentName + " " + c.VersionNumber}}
}

// linkFirmwares makes (or shares) the bundle's component versions and links
// them to it, in manifest order.
func (tx *Tx) linkFirmwares(ctx context.Context, tenant string, bundle uuid.UUID, cs []*fleet.Firmware) error {
	now := millis(tx.now)
	for i, c := range cs {
		deps, _ := json.Marshal(depsOrEmpty(c.Dependencies)) // plain data always encodes
		// A firmware made before its hashes were kept gets them now.
		if _, err := tx.exec(ctx, `INSERT INTO firmwares (tenant, id, component_name, version_number, file_name, checksum,
			content_length, uncompressed_size, dependencies, is_deactivated, md5, sha1, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, component_name, version_number)
			DO UPDATE SET md5 = excluded.md5, sha1 = excluded.sha1 WHERE firmwares.sha1 = '' AND firmwares.checksum = excluded.checksum`,
			tenant, uuid.NewString(), c.ComponentName, c.VersionNumber, c.FileName, c.Checksum,
			c.ContentLength, c.UncompressedSize, string(deps), false, c.MD5, c.SHA1, now, now); err != nil {
			return err
		}
		var id, checksum string
		if err := tx.queryRow(ctx, "SELECT id, checksum FROM firmwares WHERE tenant = ? AND component_name = ? AND version_number = ?",
			tenant, c.ComponentName, c.VersionNumber).Scan(&id, &checksum); err != nil {
			return err
		}
		if checksum != c.Checksum {
			return componentConflict(c, checksum)
		}
		if _, err := tx.exec(ctx, "INSERT INTO firmware_bundle_firmwares (tenant, bundle_id, firmware_id, position) VALUES (?, ?, ?, ?)",
			tenant, bundle.String(), id, i); err != nil {
			return err
		}
	}
	return nil
}

// AttachBundleFile records the archive of a pending bundle and, when its
// declaration is in, verifies it.
func (db *DB) AttachBundleFile(ctx context.Context, tenant string, id uuid.UUID, f *fleet.BundleFile) (*fleet.Bundle, error) {
	var out *fleet.Bundle
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, `UPDATE firmware_bundles SET blob_key = ?, content_length = ?, uncompressed_size = ?,
			checksum = ?, components = ?, updated_at = ?
			WHERE tenant = ? AND id = ? AND upload_status = ? AND blob_key IS NULL AND content_length IS NULL`,
			f.BlobKey, f.ContentLength, f.UncompressedSize, f.Checksum, encodeComponents(f.Manifest.Components), millis(tx.now),
			tenant, id.String(), fleet.UploadPending)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			row, err := tx.bundle(ctx, tenant, id)
			if err != nil {
				return err
			}
			return row.AwaitsArchive()
		}
		if err := tx.checkComponents(ctx, tenant, f.Manifest.Components); err != nil {
			return err
		}
		row, err := tx.bundle(ctx, tenant, id)
		if err != nil {
			return err
		}
		if err := tx.audit(ctx, tenant, "firmware_bundle.upload", "firmware-bundles/"+id.String(), map[string]any{
			"checksum": f.Checksum, "content_length": f.ContentLength, "uncompressed_size": f.UncompressedSize,
		}); err != nil {
			return err
		}
		out, err = tx.verifyBundle(ctx, tenant, row)
		return err
	})
	return out, err
}

// verifyBundle completes or fails a pending bundle that has both its
// archive and its declaration, and returns it as it now is.
func (tx *Tx) verifyBundle(ctx context.Context, tenant string, row *bundleRow) (*fleet.Bundle, error) {
	b := row.Bundle
	if b.UploadStatus != fleet.UploadPending || b.Declared == nil || b.Checksum == nil {
		return b, nil
	}
	status, uploadErr := fleet.UploadCompleted, ""
	if m := b.Declared.Mismatch(*b.ContentLength, *b.UncompressedSize, *b.Checksum); len(m) > 0 {
		status, uploadErr = fleet.UploadFailed, fleet.MismatchMessage(m)
	} else if err := tx.checkComponents(ctx, tenant, row.components); err != nil {
		// Another bundle took a component version since the archive came.
		status, uploadErr = fleet.UploadFailed, fleet.ErrorMessage(err)
	}
	if status == fleet.UploadCompleted {
		if err := tx.linkFirmwares(ctx, tenant, b.ID, row.components); err != nil {
			return nil, err
		}
		if _, err := tx.exec(ctx, "UPDATE firmware_bundles SET upload_status = ?, components = NULL, updated_at = ? WHERE tenant = ? AND id = ?",
			status, millis(tx.now), tenant, b.ID.String()); err != nil {
			return nil, err
		}
	} else {
		if _, err := tx.exec(ctx, "UPDATE firmware_bundles SET upload_status = ?, upload_error = ?, blob_key = NULL, components = NULL, updated_at = ? WHERE tenant = ? AND id = ?",
			status, uploadErr, millis(tx.now), tenant, b.ID.String()); err != nil {
			return nil, err
		}
	}
	if err := tx.audit(ctx, tenant, "firmware_bundle.verify", "firmware-bundles/"+b.ID.String(),
		map[string]any{"upload_status": status, "upload_error": uploadErr}); err != nil {
		return nil, err
	}
	now, err := tx.bundle(ctx, tenant, b.ID)
	if err != nil {
		return nil, err
	}
	if now.Firmwares, err = tx.bundleFirmwares(ctx, tenant, b.ID); err != nil {
		return nil, err
	}
	if status == fleet.UploadFailed {
		now.BlobKey = b.BlobKey // for the caller to delete
	}
	return now.Bundle, nil
}

// DeclareBundle records what the client declares of its archive (S5).
func (db *DB) DeclareBundle(ctx context.Context, tenant string, id uuid.UUID, d fleet.Declaration) (*fleet.Bundle, error) {
	var out *fleet.Bundle
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, `UPDATE firmware_bundles SET declared_content_length = ?, declared_uncompressed_size = ?,
			declared_checksum = ?, updated_at = ? WHERE tenant = ? AND id = ? AND upload_status = ?`,
			d.ContentLength, d.UncompressedSize, strings.ToLower(d.Checksum), millis(tx.now), tenant, id.String(), fleet.UploadPending)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		row, err := tx.bundle(ctx, tenant, id)
		if err != nil {
			return err
		}
		if n == 0 { // completed or failed: nothing changes
			if row.Firmwares, err = tx.bundleFirmwares(ctx, tenant, id); err != nil {
				return err
			}
			out = row.Bundle
			return nil
		}
		if err := tx.audit(ctx, tenant, "firmware_bundle.declare", "firmware-bundles/"+id.String(), map[string]any{
			"checksum": d.Checksum, "content_length": d.ContentLength, "uncompressed_size": d.UncompressedSize,
		}); err != nil {
			return err
		}
		out, err = tx.verifyBundle(ctx, tenant, row)
		return err
	})
	return out, err
}

// DeleteBundle removes a bundle record; its component versions stay.
func (db *DB) DeleteBundle(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Bundle, error) {
	var out *fleet.Bundle
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		row, err := tx.bundle(ctx, tenant, id)
		if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "DELETE FROM firmware_bundle_firmwares WHERE tenant = ? AND bundle_id = ?", tenant, id.String()); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "DELETE FROM firmware_bundles WHERE tenant = ? AND id = ?", tenant, id.String()); err != nil {
			return err
		}
		out = row.Bundle
		return tx.audit(ctx, tenant, "firmware_bundle.delete", "firmware-bundles/"+id.String(), map[string]any{"version": row.Version})
	})
	return out, err
}

// FindBundle returns a bundle with its component versions.
func (db *DB) FindBundle(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Bundle, error) {
	row, err := scanBundle(db.queryRow(ctx, "SELECT "+bundleColumns+" FROM firmware_bundles WHERE tenant = ? AND id = ?", tenant, id.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, bundleNotFound(id)
	} else if err != nil {
		return nil, db.classify(err)
	}
	return db.withFirmwares(ctx, tenant, row.Bundle)
}

// FindBundleByVersion returns the live bundle of a version, else its
// latest failed one.
func (db *DB) FindBundleByVersion(ctx context.Context, tenant, version string) (*fleet.Bundle, error) {
	row, err := scanBundle(db.queryRow(ctx, "SELECT "+bundleColumns+` FROM firmware_bundles WHERE tenant = ? AND version = ?
		ORDER BY CASE WHEN upload_status = ? THEN 1 ELSE 0 END, created_at DESC LIMIT 1`, tenant, version, fleet.UploadFailed))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "firmware bundle version %s not found", version)
	} else if err != nil {
		return nil, db.classify(err)
	}
	return db.withFirmwares(ctx, tenant, row.Bundle)
}

func (db *DB) withFirmwares(ctx context.Context, tenant string, b *fleet.Bundle) (*fleet.Bundle, error) {
	m, err := db.firmwaresOf(ctx, tenant, []string{b.ID.String()})
	if err != nil {
		return nil, err
	}
	if fs := m[b.ID.String()]; fs != nil {
		b.Firmwares = fs
	}
	return b, nil
}

// FindBundles lists bundles, newest first.
func (db *DB) FindBundles(ctx context.Context, tenant string, f fleet.BundleFilter) ([]*fleet.Bundle, int, error) {
	cond, args := "tenant = ?", []any{tenant}
	if f.UploadStatus != "" {
		cond += " AND upload_status = ?"
		args = append(args, f.UploadStatus)
	}
	rows, count, err := findPage(ctx, db, "SELECT count(*) FROM firmware_bundles WHERE "+cond,
		"SELECT "+bundleColumns+" FROM firmware_bundles WHERE "+cond+" ORDER BY created_at DESC, id DESC", args, f.Page, scanBundle)
	if err != nil {
		return nil, 0, err
	}
	bundles := make([]*fleet.Bundle, len(rows))
	ids := make([]string, len(rows))
	for i, row := range rows {
		bundles[i], ids[i] = row.Bundle, row.ID.String()
	}
	m, err := db.firmwaresOf(ctx, tenant, ids)
	if err != nil {
		return nil, 0, err
	}
	for _, b := range bundles {
		if fs := m[b.ID.String()]; fs != nil {
			b.Firmwares = fs
		}
	}
	return bundles, count, nil
}

const firmwareColumns = `f.id, f.component_name, f.version_number, f.file_name, f.checksum, f.content_length,
	f.uncompressed_size, f.dependencies, f.is_deactivated, f.md5, f.sha1, f.created_at, f.updated_at`

func scanFirmware(s scanner, extra ...any) (*fleet.Firmware, error) {
	var f fleet.Firmware
	var id, deps string
	var created, updated int64
	dest := append(extra, &id, &f.ComponentName, &f.VersionNumber, &f.FileName, &f.Checksum, &f.ContentLength,
		&f.UncompressedSize, &deps, &f.IsDeactivated, &f.MD5, &f.SHA1, &created, &updated)
	if err := s.Scan(dest...); err != nil {
		return nil, err
	}
	var err error
	if f.ID, err = uuid.Parse(id); err != nil {
		return nil, fmt.Errorf("firmware id %q: %w", id, err)
	}
	if err := json.Unmarshal([]byte(deps), &f.Dependencies); err != nil {
		return nil, fmt.Errorf("firmware %s dependencies: %w", id, err)
	}
	f.Dependencies = depsOrEmpty(f.Dependencies)
	f.CreatedAt, f.UpdatedAt = fromMillis(created), fromMillis(updated)
	return &f, nil
}

// firmwaresOf returns the component versions of each bundle, in manifest
// order.
func (db *DB) firmwaresOf(ctx context.Context, tenant string, bundles []string) (map[string][]*fleet.Firmware, error) {
	m := map[string][]*fleet.Firmware{}
	if len(bundles) == 0 {
		return m, nil
	}
	args := []any{tenant}
	for _, id := range bundles {
		args = append(args, id)
	}
	rows, err := db.query(ctx, "SELECT l.bundle_id, "+firmwareColumns+` FROM firmware_bundle_firmwares l
		JOIN firmwares f ON f.tenant = l.tenant AND f.id = l.firmware_id
		WHERE l.tenant = ? AND l.bundle_id IN (?`+strings.Repeat(", ?", len(bundles)-1)+`) ORDER BY l.bundle_id, l.position`, args...)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var bundle string
		f, err := scanFirmware(rows, &bundle)
		if err != nil {
			return nil, err
		}
		m[bundle] = append(m[bundle], f)
	}
	return m, db.classify(rows.Err())
}

// bundleFirmwares is firmwaresOf inside a write transaction.
func (tx *Tx) bundleFirmwares(ctx context.Context, tenant string, bundle uuid.UUID) ([]*fleet.Firmware, error) {
	rows, err := tx.query(ctx, "SELECT "+firmwareColumns+` FROM firmware_bundle_firmwares l
		JOIN firmwares f ON f.tenant = l.tenant AND f.id = l.firmware_id
		WHERE l.tenant = ? AND l.bundle_id = ? ORDER BY l.position`, tenant, bundle.String())
	if err != nil {
		return nil, err
	}
	return scanAll(rows, func(s scanner) (*fleet.Firmware, error) { return scanFirmware(s) })
}

// FindFirmwares lists a component's versions, newest version first.
// Versions order numerically, which SQL cannot, so they are sorted here; a
// component has few enough versions for that.
func (db *DB) FindFirmwares(ctx context.Context, tenant, component string, p fleet.Page) ([]*fleet.Firmware, int, error) {
	rows, err := db.query(ctx, "SELECT "+firmwareColumns+" FROM firmwares f WHERE f.tenant = ? AND f.component_name = ?", tenant, component)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	defer rows.Close()
	var all []*fleet.Firmware
	for rows.Next() {
		f, err := scanFirmware(rows)
		if err != nil {
			return nil, 0, err
		}
		all = append(all, f)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, db.classify(err)
	}
	if len(all) == 0 {
		return nil, 0, fleet.Errorf(fleet.ENOTFOUND, "component %q has no firmware versions", component)
	}
	slices.SortFunc(all, func(a, b *fleet.Firmware) int {
		if c := fleet.CompareVersions(b.VersionNumber, a.VersionNumber); c != 0 {
			return c
		}
		return strings.Compare(b.VersionNumber, a.VersionNumber)
	})
	start := min(p.Offset(), len(all))
	end := min(start+p.Limit, len(all))
	return all[start:end], len(all), nil
}

// FindFirmwareByID returns one component version.
func (db *DB) FindFirmwareByID(ctx context.Context, tenant string, id uuid.UUID) (*fleet.Firmware, error) {
	f, err := scanFirmware(db.queryRow(ctx, "SELECT "+firmwareColumns+" FROM firmwares f WHERE f.tenant = ? AND f.id = ?", tenant, id.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "firmware %s not found", id)
	}
	return f, err
}

// FindFirmware returns one component version.
func (db *DB) FindFirmware(ctx context.Context, tenant, component, version string) (*fleet.Firmware, error) {
	f, err := scanFirmware(db.queryRow(ctx, "SELECT "+firmwareColumns+" FROM firmwares f WHERE f.tenant = ? AND f.component_name = ? AND f.version_number = ?",
		tenant, component, version))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "component %s version %s not found", component, version)
	}
	return f, db.classify(err)
}

// FindDependentFirmwares lists the tenant's component versions that have
// dependencies.
func (db *DB) FindDependentFirmwares(ctx context.Context, tenant string) ([]*fleet.Firmware, error) {
	rows, err := db.query(ctx, "SELECT "+firmwareColumns+" FROM firmwares f WHERE f.tenant = ? AND f.dependencies <> '[]'", tenant)
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var out []*fleet.Firmware
	for rows.Next() {
		f, err := scanFirmware(rows)
		if err != nil {
			return nil, err
		}
		if len(f.Dependencies) > 0 {
			out = append(out, f)
		}
	}
	return out, db.classify(rows.Err())
}

// UpdateFirmware changes one component version (S8).
func (db *DB) UpdateFirmware(ctx context.Context, tenant, component, version string, u fleet.FirmwareUpdate) (*fleet.Firmware, error) {
	var out *fleet.Firmware
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		f, err := scanFirmware(tx.queryRow(ctx, "SELECT "+firmwareColumns+" FROM firmwares f WHERE f.tenant = ? AND f.component_name = ? AND f.version_number = ?",
			tenant, component, version))
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "component %s version %s not found", component, version)
		} else if err != nil {
			return err
		}
		details := map[string]any{}
		if u.IsDeactivated != nil {
			f.IsDeactivated = *u.IsDeactivated
			details["is_deactivated"] = f.IsDeactivated
		}
		if u.UncompressedSize != nil {
			f.UncompressedSize = *u.UncompressedSize
			details["uncompressed_size"] = f.UncompressedSize
		}
		if u.Dependencies != nil {
			f.Dependencies = depsOrEmpty(*u.Dependencies)
			details["dependencies"] = f.Dependencies
		}
		f.UpdatedAt = fromMillis(millis(tx.now))
		deps, _ := json.Marshal(f.Dependencies) // plain data always encodes
		if _, err := tx.exec(ctx, "UPDATE firmwares SET is_deactivated = ?, uncompressed_size = ?, dependencies = ?, updated_at = ? WHERE tenant = ? AND id = ?",
			f.IsDeactivated, f.UncompressedSize, string(deps), millis(tx.now), tenant, f.ID.String()); err != nil {
			return err
		}
		out = f
		return tx.audit(ctx, tenant, "firmware.update", "firmwares/component/"+component+"/"+version, details)
	})
	return out, err
}

// ServerSecret returns a server-wide secret, made on first use. Replicas
// racing to make it agree on whichever row was inserted first.
func (db *DB) ServerSecret(ctx context.Context, name string) ([]byte, error) {
	var value string
	err := db.queryRow(ctx, "SELECT value FROM server_secrets WHERE name = ?", name).Scan(&value)
	if errors.Is(err, sql.ErrNoRows) {
		b := make([]byte, 32)
		rand.Read(b) // never fails (crypto/rand)
		err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
			if _, err := tx.exec(ctx, "INSERT INTO server_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING", name, hex.EncodeToString(b)); err != nil {
				return err
			}
			return tx.queryRow(ctx, "SELECT value FROM server_secrets WHERE name = ?", name).Scan(&value)
		})
	}
	if err != nil {
		return nil, db.classify(err)
	}
	secret, err := hex.DecodeString(value)
	if err != nil {
		return nil, fmt.Errorf("server secret %s is not hex: %w", name, err)
	}
	return secret, nil
}
