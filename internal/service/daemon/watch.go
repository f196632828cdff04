package daemon

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// watcher reloads the rules and the TLS files: on a signal (reload) and,
// polled, when they change (poll). One goroutine calls it.
type watcher struct {
	log   *slog.Logger
	rules Rules
	apply Apply
	tls   *rls.ServerTLS // nil without TLS
	// tlsErr is the last TLS reload error logged by poll: the same error
	// again (a file missing for the whole of a rotation) is not logged
	// again until a reload succeeds or the error changes.
	tlsErr string
	// creds reload the proxies' credentials and the admin's.
	creds []*credentials
}

// serve reloads on hup and, every interval (0: never), when the sources
// changed, until ctx is done (nil) or a listener fails (its error).
func (w *watcher) serve(ctx context.Context, hup <-chan os.Signal, interval time.Duration, errc <-chan error) error {
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			w.reload("SIGHUP")
		case <-tick:
			w.poll()
		case err := <-errc:
			return err
		}
	}
}

// poll reloads what changed since the last look.
func (w *watcher) poll() {
	w.rules.Poll(w.apply)
	for _, c := range w.creds {
		c.reload(w.log, "file changed", false)
	}
	if w.tls == nil {
		return
	}
	ok, err := w.tls.ReloadIfChanged()
	switch {
	case err != nil && err.Error() != w.tlsErr:
		w.tlsErr = err.Error()
		w.log.Error("TLS files not reloaded: the previous ones stay", "trigger", "file changed", "error", err)
	case err == nil:
		w.tlsErr = ""
		if ok {
			w.log.Info("TLS files reloaded", "trigger", "file changed")
		}
	}
}

// reload loads the rules and the TLS files again.
func (w *watcher) reload(why string) {
	w.rules.Reload(why, w.apply)
	for _, c := range w.creds {
		c.reload(w.log, why, true)
	}
	if w.tls == nil {
		return
	}
	if err := w.tls.Reload(); err != nil {
		w.log.Error("TLS files not reloaded: the previous ones stay", "trigger", why, "error", err)
		return
	}
	w.tlsErr = ""
	w.log.Info("TLS files reloaded", "trigger", why)
}

// credentials reloads the proxies' credentials from their file
// (Settings.CredentialFile) into the server's write rule.
type credentials struct {
	file string
	base rls.WriteAuth       // the rule, with the file's credentials as read at start
	set  func(rls.WriteAuth) // the server's SetWriteAuth
	last [sha256.Size]byte   // the digest of the contents in force
	err  string              // the last error logged, not logged again
}

func newCredentials(file string, base rls.WriteAuth, set func(rls.WriteAuth)) *credentials {
	c := &credentials{file: file, base: base, set: set}
	if b, err := os.ReadFile(file); err == nil {
		c.last = sha256.Sum256(b)
	}
	return c
}

// reload reads the file again and, when it reads and (unless force) its
// contents changed, puts its credentials in force; when it does not read,
// the credentials in force stay and the error is logged once.
func (c *credentials) reload(log *slog.Logger, why string, force bool) {
	b, err := os.ReadFile(c.file)
	if err == nil && !force && sha256.Sum256(b) == c.last {
		return
	}
	var secrets []string
	if err == nil {
		secrets, err = rls.ParseCredentials(c.file, b)
	}
	if err != nil {
		if err.Error() != c.err {
			c.err = err.Error()
			log.Error("credentials not reloaded: the ones in force stay", "trigger", why, "error", err)
		}
		return
	}
	c.err = ""
	c.last = sha256.Sum256(b)
	c.set(c.base.WithCredentials(secrets))
	log.Info("credentials reloaded", "file", c.file, "trigger", why, "credentials", len(secrets))
}
