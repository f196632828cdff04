package daemon

import (
	"context"
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
