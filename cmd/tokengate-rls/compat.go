package main

// The drop-in for envoyproxy/ratelimit (docs/dropin.md): started as
// "ratelimit" (the image's /bin/ratelimit, the command Envoy Gateway and
// Istio's sample run), tokengate-rls reads that project's environment
// instead of flags, its YAML runtime directory or its xDS source, and
// serves its listeners, health check and answers.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin"
)

// isRatelimit reports whether the program was started under
// envoyproxy/ratelimit's name.
func isRatelimit(arg0 string) bool { return filepath.Base(arg0) == "ratelimit" }

// runRatelimit is run for the drop-in: the service's lifecycle
// (daemon.Run) with the settings the environment gives.
func runRatelimit(ctx context.Context, get func(string) (string, bool), logw io.Writer, listening chan<- [2]string) error {
	return runRatelimitArgs(ctx, nil, get, logw, listening)
}

// runRatelimitArgs is runRatelimit with a command line, which may set
// -drain and -drain-delay (ratelimitFlags).
func runRatelimitArgs(ctx context.Context, args []string, get func(string) (string, bool), logw io.Writer, listening chan<- [2]string) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	e, err := dropin.ParseSettings(get)
	if err != nil {
		return err
	}
	if err := ratelimitFlags(args, e, logw); err != nil {
		return err
	}
	logger, err := newLogger(logw, e.LogLevel(), e.LogFormat())
	if err != nil {
		return err
	}
	for _, n := range e.Notes() {
		logger.Warn("not implemented: " + n)
	}
	s, err := e.Daemon(logger, hup)
	if err != nil {
		return err
	}
	s.Serving = func(sv daemon.Serving) {
		logger.Info("envoyproxy/ratelimit drop-in serving", e.ServingAttrs(sv)...)
		if listening != nil {
			listening <- [2]string{sv.GRPC, sv.HTTP[0]}
		}
	}
	return daemon.Run(ctx, s)
}

// ratelimitFlags reads the drop-in's command line: envoyproxy/ratelimit
// takes no flags, and the drop-in only tokengate-rls's -drain and
// -drain-delay, which win over their environment variables
// (TOKENGATE_RLS_DRAIN, TOKENGATE_RLS_DRAIN_DELAY).
func ratelimitFlags(args []string, e *dropin.Settings, logw io.Writer) error {
	drain, delay := e.Drain()
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(logw)
	fs.DurationVar(&drain, "drain", drain, "how long shutdown waits for calls in flight")
	fs.DurationVar(&delay, "drain-delay", delay, "on SIGTERM, how long the service keeps serving, not ready, before it stops accepting calls")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: started as ratelimit, tokengate-rls reads envoyproxy/ratelimit's environment (docs/dropin.md)", fs.Args())
	}
	if drain <= 0 || delay < 0 {
		return errors.New("-drain must be positive and -drain-delay not negative")
	}
	e.SetDrain(drain, delay)
	return nil
}
