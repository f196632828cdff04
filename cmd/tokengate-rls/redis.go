package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tokengate/tokengate/internal/service/redisstore"
)

// Environment variables that carry Redis passwords when no file names
// them: a secret is never a flag, which ps(1) would show.
const (
	envRedisPassword    = "TOKENGATE_RLS_REDIS_PASSWORD"
	envSentinelPassword = "TOKENGATE_RLS_REDIS_SENTINEL_PASSWORD"
)

// redisSecurity holds the flags of Redis AUTH, TLS and Sentinel
// (docs/rls.md#redis-auth-tls-and-sentinel).
type redisSecurity struct {
	user, passwordFile              *string
	tlsOn                           *bool
	tlsCA, tlsCert, tlsKey, tlsName *string
	sentinelMaster, sentinelUser    *string
	sentinelPasswordFile            *string
}

func (r *redisSecurity) flags(fs *flag.FlagSet) {
	r.user = fs.String("redis-user", "", "Redis ACL `user` (AUTH); empty: the default user")
	r.passwordFile = fs.String("redis-password-file", "", "`file` holding the Redis password (else $"+envRedisPassword+")")
	r.tlsOn = fs.Bool("redis-tls", false, "connect to Redis over TLS (implied by the other -redis-tls-* flags)")
	r.tlsCA = fs.String("redis-tls-ca", "", "PEM `file` of the CAs that sign Redis's certificate (default: the system's)")
	r.tlsCert = fs.String("redis-tls-cert", "", "PEM `file` of the client certificate presented to Redis (with -redis-tls-key)")
	r.tlsKey = fs.String("redis-tls-key", "", "PEM `file` of the client certificate's key")
	r.tlsName = fs.String("redis-tls-server-name", "", "`name` Redis's certificate must hold (default: the address's host)")
	r.sentinelMaster = fs.String("redis-sentinel-master", "", "master set `name`: -redis addresses are Redis Sentinels, and the service follows that master")
	r.sentinelUser = fs.String("redis-sentinel-user", "", "ACL `user` of the Sentinels")
	r.sentinelPasswordFile = fs.String("redis-sentinel-password-file", "", "`file` holding the Sentinels' password (else $"+envSentinelPassword+")")
}

// secret reads a password from file, or else from the environment
// variable env; a file's trailing newline is not part of it.
func secret(file, env string, getenv func(string) string) (string, error) {
	if file == "" {
		return getenv(env), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// apply sets o's AUTH, TLS and Sentinel fields from the flags.
func (r *redisSecurity) apply(o *redisstore.Options, getenv func(string) string) error {
	var err error
	o.Username = *r.user
	if o.Password, err = secret(*r.passwordFile, envRedisPassword, getenv); err != nil {
		return fmt.Errorf("-redis-password-file: %w", err)
	}
	if (*r.tlsCert == "") != (*r.tlsKey == "") {
		return errors.New("-redis-tls-cert and -redis-tls-key go together")
	}
	if *r.tlsOn || *r.tlsCA != "" || *r.tlsCert != "" || *r.tlsName != "" {
		c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: *r.tlsName}
		if *r.tlsCA != "" {
			pem, err := os.ReadFile(*r.tlsCA)
			if err != nil {
				return fmt.Errorf("-redis-tls-ca: %w", err)
			}
			c.RootCAs = x509.NewCertPool()
			if !c.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-redis-tls-ca %s: no PEM certificate", *r.tlsCA)
			}
		}
		if *r.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(*r.tlsCert, *r.tlsKey)
			if err != nil {
				return fmt.Errorf("-redis-tls-cert/-redis-tls-key: %w", err)
			}
			c.Certificates = []tls.Certificate{cert}
		}
		o.TLS = c
	}
	o.SentinelMaster = *r.sentinelMaster
	if o.SentinelMaster != "" {
		o.SentinelUsername = *r.sentinelUser
		if o.SentinelPassword, err = secret(*r.sentinelPasswordFile, envSentinelPassword, getenv); err != nil {
			return fmt.Errorf("-redis-sentinel-password-file: %w", err)
		}
		o.SentinelTLS = o.TLS
	}
	return nil
}
