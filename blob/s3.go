package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Store in a bucket of AWS S3 or an S3-compatible service (MinIO,
// Cloudflare R2, GCS in interoperability mode, VersityGW), under a prefix.
//
// Put is a multipart upload: parts of PartSize bytes go out as they fill,
// so an upload holds one part in memory and nothing on local disk, and the
// object stays invisible until Commit completes the upload (Abort aborts
// it). Open reads with ranged GETs from wherever the reader seeks, so a
// download with Range fetches only what it sends.
type S3 struct {
	core     minio.Core
	bucket   string
	prefix   string // "" or elements ending in "/"
	partSize int64
	parts    sync.Pool // of *[]byte, each partSize long
	presign  time.Duration
}

var _ Store = (*S3)(nil)

// S3Config is where an S3 store is and how to reach it.
type S3Config struct {
	Bucket string
	Prefix string // slash-separated key elements, or empty
	// Endpoint is the service's base URL (http://127.0.0.1:7070); empty
	// is AWS S3 over HTTPS.
	Endpoint string
	Region   string
	// PathStyle puts the bucket in the path rather than the host name, as
	// most S3-compatible servers on a host:port need.
	PathStyle bool
	// PartSize is the size of an upload's parts, at least 5 MiB (S3's
	// minimum); 0 is DefaultPartSize. An object has at most 10,000 parts.
	PartSize int64
	// Presign, when set, is how long a download URL stays valid: fleetd
	// then redirects downloads to the object in S3 instead of streaming
	// them (Presigner). At most 7 days, S3's limit.
	Presign time.Duration
	// Credentials: static keys when AccessKey is set, else the standard
	// AWS chain (shared credentials file and profile, then the instance's
	// or container's role).
	AccessKey, SecretKey, SessionToken string
	Profile                            string
}

// DefaultPartSize makes objects of up to 80 GB (10,000 parts) with 8 MiB
// of memory per upload in progress.
const DefaultPartSize = 8 << 20

const minPartSize = 5 << 20

// ParseS3URL reads s3://bucket/prefix?endpoint=…&region=…&path_style=true
// &part_size=BYTES&presign=DURATION, and the credentials of the standard AWS variables
// through getenv (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN, AWS_PROFILE, AWS_REGION).
func ParseS3URL(raw string, getenv func(string) string) (S3Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return S3Config{}, fmt.Errorf("blob: %q: want s3://bucket/prefix", raw)
	}
	c := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"),
		AccessKey: getenv("AWS_ACCESS_KEY_ID"), SecretKey: getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: getenv("AWS_SESSION_TOKEN"), Profile: getenv("AWS_PROFILE"), Region: getenv("AWS_REGION")}
	if c.Prefix != "" {
		if _, err := splitKey(c.Prefix); err != nil {
			return S3Config{}, fmt.Errorf("blob: %q: the prefix must be elements of [A-Za-z0-9._-] separated by /", raw)
		}
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "endpoint":
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || strings.Trim(e.Path, "/") != "" {
				return S3Config{}, fmt.Errorf("blob: %q: endpoint must be http://host:port or https://host", raw)
			}
			c.Endpoint = v
		case "region":
			c.Region = v
		case "path_style":
			if c.PathStyle, err = strconv.ParseBool(v); err != nil {
				return S3Config{}, fmt.Errorf("blob: %q: path_style must be true or false", raw)
			}
		case "presign":
			if c.Presign, err = time.ParseDuration(v); err != nil || c.Presign < time.Second || c.Presign > 7*24*time.Hour {
				return S3Config{}, fmt.Errorf("blob: %q: presign must be a duration from 1s to 168h, such as 15m", raw)
			}
		case "part_size":
			if c.PartSize, err = strconv.ParseInt(v, 10, 64); err != nil || c.PartSize < minPartSize || c.PartSize > 1<<30 {
				return S3Config{}, fmt.Errorf("blob: %q: part_size must be a number of bytes from %d (5 MiB) to %d (1 GiB)", raw, minPartSize, 1<<30)
			}
		default:
			return S3Config{}, fmt.Errorf("blob: %q: unknown parameter %q (known: endpoint, region, path_style, part_size, presign)", raw, k)
		}
	}
	return c, nil
}

// OpenS3 connects to the bucket and checks that it exists, so that a
// wrong bucket, endpoint or credential stops fleetd at its start rather
// than at the first upload. It aborts the multipart uploads under the
// prefix that a crash left behind (a day old and more).
func OpenS3(ctx context.Context, c S3Config) (*S3, error) {
	endpoint, secure := "s3.amazonaws.com", true
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("blob: endpoint %q: %w", c.Endpoint, err)
		}
		endpoint, secure = u.Host, u.Scheme == "https"
	}
	var creds *credentials.Credentials
	if c.AccessKey != "" {
		creds = credentials.NewStaticV4(c.AccessKey, c.SecretKey, c.SessionToken)
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.FileAWSCredentials{Profile: c.Profile},
			&credentials.IAM{},
		})
	}
	lookup := minio.BucketLookupAuto
	if c.PathStyle {
		lookup = minio.BucketLookupPath
	}
	client, err := minio.New(endpoint, &minio.Options{Creds: creds, Secure: secure, Region: c.Region, BucketLookup: lookup})
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	s := &S3{core: minio.Core{Client: client}, bucket: c.Bucket, partSize: c.PartSize, presign: c.Presign}
	if c.Prefix != "" {
		s.prefix = c.Prefix + "/"
	}
	if s.partSize == 0 {
		s.partSize = DefaultPartSize
	}
	s.parts.New = func() any { b := make([]byte, s.partSize); return &b }
	ok, err := client.BucketExists(ctx, c.Bucket)
	if err != nil {
		return nil, fmt.Errorf("blob: reach bucket %q: %w", c.Bucket, err)
	} else if !ok {
		return nil, fmt.Errorf("blob: bucket %q does not exist", c.Bucket)
	}
	for u := range client.ListIncompleteUploads(ctx, c.Bucket, s.prefix, true) {
		if u.Err != nil {
			break // a store that cannot list them keeps them; they are invisible
		}
		if time.Since(u.Initiated) > staleTemp {
			s.core.AbortMultipartUpload(ctx, c.Bucket, u.Key, u.UploadID)
		}
	}
	return s, nil
}

// object returns the object name of key.
func (s *S3) object(key string) (string, error) {
	if _, err := splitKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// notFound reports whether err is S3's answer for a missing object.
func notFound(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.StatusCode == http.StatusNotFound || r.Code == "NoSuchKey"
}

// Put uploads r part by part; the object appears only on Commit.
func (s *S3) Put(ctx context.Context, key string, r io.Reader) (Pending, error) {
	name, err := s.object(key)
	if err != nil {
		return nil, err
	}
	id, err := s.core.NewMultipartUpload(ctx, s.bucket, name, minio.PutObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("blob: start upload of %s: %w", key, err)
	}
	p := &s3Pending{s: s, name: name, id: id}
	bp := s.parts.Get().(*[]byte)
	defer s.parts.Put(bp)
	buf := *bp
	r = ctxReader{ctx, r}
	for {
		n, rerr := io.ReadFull(r, buf)
		last := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !last {
			p.Abort(ctx)
			return nil, rerr
		}
		// A part on its own may be shorter than S3's 5 MiB, and even
		// empty when the whole object is.
		if n > 0 || len(p.parts) == 0 {
			if len(p.parts) == 10_000 {
				p.Abort(ctx)
				return nil, fmt.Errorf("blob: %s is larger than 10,000 parts of %d bytes", key, s.partSize)
			}
			part, err := s.core.PutObjectPart(ctx, s.bucket, name, id, len(p.parts)+1,
				bytes.NewReader(buf[:n]), int64(n), minio.PutObjectPartOptions{})
			if err != nil {
				p.Abort(ctx)
				return nil, fmt.Errorf("blob: upload part of %s: %w", key, err)
			}
			p.parts = append(p.parts, minio.CompletePart{PartNumber: part.PartNumber, ETag: part.ETag})
			p.size += int64(n)
		}
		if last {
			return p, nil
		}
	}
}

type s3Pending struct {
	s     *S3
	name  string
	id    string
	parts []minio.CompletePart
	size  int64
	done  bool
}

func (p *s3Pending) Size() int64 { return p.size }

// Commit completes the multipart upload, which S3 does atomically.
func (p *s3Pending) Commit(ctx context.Context) error {
	if p.done {
		return errors.New("blob: commit after commit or abort")
	}
	if _, err := p.s.core.CompleteMultipartUpload(ctx, p.s.bucket, p.name, p.id, p.parts, minio.PutObjectOptions{}); err != nil {
		return fmt.Errorf("blob: complete upload of %s: %w", p.name, err)
	}
	p.done = true
	return nil
}

func (p *s3Pending) Abort(ctx context.Context) error {
	if p.done {
		return nil
	}
	p.done = true
	// The context may be the cancelled one that stopped the upload.
	err := p.s.core.AbortMultipartUpload(context.WithoutCancel(ctx), p.s.bucket, p.name, p.id)
	if err != nil && !notFound(err) {
		return fmt.Errorf("blob: abort upload of %s: %w", p.name, err)
	}
	return nil
}

// Open looks the object up; its bytes are read when asked for.
func (s *S3) Open(ctx context.Context, key string) (Object, error) {
	name, err := s.object(key)
	if err != nil {
		return nil, err
	}
	info, err := s.core.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if notFound(err) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, fmt.Errorf("blob: stat %s: %w", key, err)
	}
	return &s3Object{ctx: ctx, s: s, name: name, etag: info.ETag, size: info.Size, mod: info.LastModified}, nil
}

// s3Object reads from its offset with one GET, open-ended, that a Seek
// elsewhere closes. The GET is bound to the object's ETag: bytes of two
// versions are never mixed.
type s3Object struct {
	ctx  context.Context // the Open's, usually a request's
	s    *S3
	name string
	etag string
	size int64
	mod  time.Time
	off  int64
	body io.ReadCloser
}

func (o *s3Object) Size() int64        { return o.size }
func (o *s3Object) ModTime() time.Time { return o.mod }

func (o *s3Object) Read(p []byte) (int, error) {
	if o.off >= o.size {
		return 0, io.EOF
	}
	if o.body == nil {
		var opts minio.GetObjectOptions
		if o.etag != "" {
			opts.SetMatchETag(o.etag)
		}
		if o.off > 0 {
			opts.SetRange(o.off, 0)
		}
		body, _, _, err := o.s.core.GetObject(o.ctx, o.s.bucket, o.name, opts)
		if err != nil {
			return 0, fmt.Errorf("blob: get %s from %d: %w", o.name, o.off, err)
		}
		o.body = body
	}
	n, err := o.body.Read(p)
	o.off += int64(n)
	if err == io.EOF && o.off < o.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (o *s3Object) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += o.off
	case io.SeekEnd:
		offset += o.size
	}
	if offset < 0 {
		return 0, errors.New("blob: seek before the start")
	}
	if offset != o.off && o.body != nil {
		o.body.Close()
		o.body = nil
	}
	o.off = offset
	return offset, nil
}

func (o *s3Object) Close() error {
	if o.body != nil {
		o.body.Close()
		o.body = nil
	}
	return nil
}

// Delete removes an object. S3 deletes a missing object without a word,
// so Delete looks first: a second Delete is ErrNotFound, as Dir's is.
func (s *S3) Delete(ctx context.Context, key string) error {
	name, err := s.object(key)
	if err != nil {
		return err
	}
	if _, err := s.core.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{}); notFound(err) {
		return ErrNotFound
	} else if err != nil {
		return fmt.Errorf("blob: stat %s: %w", key, err)
	}
	if err := s.core.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("blob: delete %s: %w", key, err)
	}
	return nil
}

// Walk lists the objects under prefix, in S3's order, which is lexical;
// uploads in progress are not objects.
func (s *S3) Walk(ctx context.Context, prefix string, fn func(key string, mod time.Time) error) error {
	name, err := s.object(prefix)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing when fn stops the walk
	for o := range s.core.Client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: name + "/", Recursive: true}) {
		if o.Err != nil {
			return fmt.Errorf("blob: walk %s: %w", prefix, o.Err)
		}
		key := strings.TrimPrefix(o.Key, s.prefix)
		if _, err := splitKey(key); err != nil || path.Clean(key) != key {
			continue // not written by a Store
		}
		if err := fn(key, o.LastModified); err != nil {
			return fmt.Errorf("blob: walk %s: %w", prefix, err)
		}
	}
	return nil
}

// PresignGet returns a URL that downloads the object without credentials
// until the store's presign duration passes, named fileName when saved;
// "" when the store was not configured to presign.
func (s *S3) PresignGet(ctx context.Context, key, fileName string) (string, error) {
	if s.presign == 0 {
		return "", nil
	}
	name, err := s.object(key)
	if err != nil {
		return "", err
	}
	q := url.Values{"response-content-disposition": {mime.FormatMediaType("attachment", map[string]string{"filename": fileName})}}
	u, err := s.core.PresignedGetObject(ctx, s.bucket, name, s.presign, q)
	if err != nil {
		return "", fmt.Errorf("blob: presign %s: %w", key, err)
	}
	return u.String(), nil
}
