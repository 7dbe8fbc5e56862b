// Package client asks bandplane's policy decisions over HTTP, as the routing core does:
// POST /v1/decisions/{name} with a router key. With several policy replicas it follows
// a 421 Misdirected Request to the replica that owns the agent's organization (at most
// MaxHops, only to a replica of its own peer list) and remembers the owner of each
// agent, so that the next decision goes there directly.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/shard"
)

// Defaults of Config.
const (
	DefaultTimeout          = 5 * time.Second
	DefaultMaxResponseBytes = 4 << 20 // a peer list of a few thousand peers
	DefaultMaxOwners        = 100_000
	// MaxHops is how many 421s one decision follows: the owner answers the first
	// redirect; a second covers a peer list that changed under a cached owner.
	MaxHops = 2
)

// Errors of Decide besides *Error. A refused redirect sends nothing to where it points.
var (
	ErrForeignOwner     = errors.New("policy client: a replica named an owner outside the configured peer list")
	ErrRedirectLoop     = errors.New("policy client: the replicas sent the decision around in a loop")
	ErrTooManyHops      = errors.New("policy client: too many 421 redirects")
	ErrResponseTooLarge = errors.New("policy client: the answer is larger than MaxResponseBytes")
)

// Error is an answer of the decision API other than 200 (after redirects).
type Error struct {
	URL     string
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("policy decision at %s: %d %s: %s", e.URL, e.Status, e.Code, e.Message)
}

// Config configures a Client.
type Config struct {
	// Endpoint is where a decision goes when the agent's owner is not known yet: a
	// load balancer in front of the replicas, or any replica. Default: Peers[0].
	Endpoint string
	// Peers are the base URLs of the policy replicas (serve's --policy-peers): the only
	// places a 421 may send the client, and so its API key. Empty: one replica at
	// Endpoint, and a 421 is an error.
	Peers []string
	// APIKey is a router key (schema/README.md, "Keys and roles"). Required.
	APIKey string
	// HTTPClient sends the requests (default: one with pooled keep-alive connections).
	// Its HTTP redirects are never followed: only a 421 moves a decision.
	HTTPClient *http.Client
	// Timeout bounds each request (default DefaultTimeout).
	Timeout time.Duration
	// MaxResponseBytes bounds an answer's body (default DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// MaxOwners bounds the agents whose owner is remembered (default DefaultMaxOwners).
	MaxOwners int
}

// Validate reports every problem of c.
func (c *Config) Validate() error {
	var errs []error
	if c.APIKey == "" {
		errs = append(errs, errors.New("policy client: no API key"))
	}
	if c.Endpoint == "" && len(c.Peers) == 0 {
		errs = append(errs, errors.New("policy client: no endpoint and no peers"))
	}
	if c.Endpoint != "" {
		if _, err := shard.Normalize(c.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("policy client: endpoint: %w", err))
		}
	}
	if len(c.Peers) > 0 {
		sc := shard.Config{Peers: c.Peers, Self: c.Peers[0]}
		if err := sc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("policy client: peers: %w", err))
		}
	}
	if c.Timeout < 0 || c.MaxResponseBytes < 0 || c.MaxOwners < 0 {
		errs = append(errs, errors.New("policy client: timeout, max response bytes and max owners must not be negative"))
	}
	return errors.Join(errs...)
}

// Client asks decisions. Safe for concurrent use.
type Client struct {
	cfg      Config
	http     *http.Client
	endpoint string
	peers    map[string]bool // normalized

	mu     sync.Mutex
	owners map[string]string // agent -> owner's base URL
}

// New validates cfg and returns a client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxOwners == 0 {
		cfg.MaxOwners = DefaultMaxOwners
	}
	c := &Client{cfg: cfg, peers: map[string]bool{}, owners: map[string]string{}}
	for _, p := range cfg.Peers {
		n, _ := shard.Normalize(p)
		c.peers[n] = true
	}
	c.endpoint = cfg.Endpoint
	if c.endpoint == "" {
		c.endpoint = cfg.Peers[0]
	}
	c.endpoint, _ = shard.Normalize(c.endpoint)
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConns: 256, MaxIdleConnsPerHost: 64,
			IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: cfg.Timeout,
		}}
	}
	copied := *hc
	copied.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.http = &copied
	return c, nil
}

// Decide asks decision name about input (a policy input struct, a map, or raw JSON as
// json.RawMessage or []byte). A send_message goes to the agent's owner when known,
// else to Endpoint; a 421 is followed to the owner it names, if that is one of Peers.
// Answers other than 200 are *Error.
func (c *Client) Decide(ctx context.Context, name string, input any) (policy.Decision, error) {
	body, err := encode(input)
	if err != nil {
		return policy.Decision{}, fmt.Errorf("cannot encode the %s input: %w", name, err)
	}
	agent := ""
	if name == policy.SendMessage {
		agent = agentOf(body)
	}
	target := c.endpoint
	if owner, ok := c.owner(agent); ok {
		target = owner
	}
	tried := []string{target}
	for hops := 0; ; hops++ {
		d, status, owner, err := c.post(ctx, target, name, body)
		switch {
		case err != nil:
			if target != c.endpoint {
				c.forget(agent, target) // the owner may be gone; the endpoint knows the new one
			}
			return policy.Decision{}, err
		case status == http.StatusOK:
			if owner != "" && c.peers[owner] {
				c.remember(agent, owner)
			}
			return d, nil
		}
		// A 421: owner is set, and checked below before anything is sent to it.
		if !c.peers[owner] {
			c.forget(agent, target)
			return policy.Decision{}, fmt.Errorf("%w: %s named %q for a %s decision (peers: %s)", ErrForeignOwner, target, owner, name, strings.Join(c.cfg.Peers, ","))
		}
		if slices.Contains(tried, owner) {
			c.forget(agent, target)
			return policy.Decision{}, fmt.Errorf("%w: %s → %s", ErrRedirectLoop, strings.Join(tried, " → "), owner)
		}
		if hops+1 > MaxHops {
			c.forget(agent, target)
			return policy.Decision{}, fmt.Errorf("%w: %s → %s", ErrTooManyHops, strings.Join(tried, " → "), owner)
		}
		c.remember(agent, owner)
		target = owner
		tried = append(tried, owner)
	}
}

// post sends one request. It returns the decision of a 200, the owner named by a 200
// or a 421 (normalized; "" when none or not a URL), or an error for any other answer.
func (c *Client) post(ctx context.Context, base, name string, body []byte) (policy.Decision, int, string, error) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	url := base + "/v1/decisions/" + name
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return policy.Decision{}, 0, "", fmt.Errorf("cannot make the request to %s: %w", url, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return policy.Decision{}, 0, "", fmt.Errorf("cannot ask %s: %w", url, err)
	}
	defer resp.Body.Close() //nolint:errcheck // the body is read below; closing it loses nothing
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		return policy.Decision{}, 0, "", fmt.Errorf("cannot read the answer of %s: %w", url, err)
	}
	if int64(len(raw)) > c.cfg.MaxResponseBytes {
		return policy.Decision{}, 0, "", fmt.Errorf("%w (%d bytes) from %s", ErrResponseTooLarge, c.cfg.MaxResponseBytes, url)
	}
	owner := ""
	if h := resp.Header.Get(shard.OwnerHeader); h != "" {
		owner, _ = shard.Normalize(h)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		var d policy.Decision
		if err := json.Unmarshal(raw, &d); err != nil {
			return policy.Decision{}, 0, "", fmt.Errorf("cannot decode the answer of %s: %w", url, err)
		}
		return d, http.StatusOK, owner, nil
	case http.StatusMisdirectedRequest:
		var mis struct {
			Code  string `json:"code"`
			Owner string `json:"owner"`
		}
		if err := json.Unmarshal(raw, &mis); err != nil || mis.Code != shard.CodeMisdirected {
			return policy.Decision{}, 0, "", &Error{URL: url, Status: resp.StatusCode, Code: mis.Code, Message: "a 421 that is not the policy API's: " + snippet(raw)}
		}
		if owner == "" {
			owner, _ = shard.Normalize(mis.Owner)
		}
		if owner == "" {
			owner = mis.Owner // refused as foreign by the caller, and named in its error
		}
		return policy.Decision{}, resp.StatusCode, owner, nil
	}
	var eb struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if json.Unmarshal(raw, &eb) != nil || eb.Error == "" {
		eb.Error = snippet(raw)
	}
	return policy.Decision{}, 0, "", &Error{URL: url, Status: resp.StatusCode, Code: eb.Code, Message: eb.Error}
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func encode(input any) ([]byte, error) {
	switch v := input.(type) {
	case json.RawMessage:
		return v, nil
	case []byte:
		return v, nil
	}
	return json.Marshal(input)
}

// agentOf is the agent of a send_message input ("" when it has none).
func agentOf(body []byte) string {
	var in struct {
		Agent string `json:"agent"`
	}
	_ = json.Unmarshal(body, &in)
	return in.Agent
}

func (c *Client) owner(agent string) (string, bool) {
	if agent == "" {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.owners[agent]
	return o, ok
}

func (c *Client) remember(agent, owner string) {
	if agent == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.owners[agent]; !ok && len(c.owners) >= c.cfg.MaxOwners {
		for k := range c.owners { // any one: the next decision of it costs one hop
			delete(c.owners, k)
			break
		}
	}
	c.owners[agent] = owner
}

// forget drops agent's owner if it is still target.
func (c *Client) forget(agent, target string) {
	if agent == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owners[agent] == target {
		delete(c.owners, agent)
	}
}

// Owner is the replica the client sends agent's send_message decisions to, if it
// knows one.
func (c *Client) Owner(agent string) (string, bool) { return c.owner(agent) }
