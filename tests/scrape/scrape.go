// Package scrape reads an endpoint of the operator's metrics server as a scraper would:
// over HTTPS with a bearer token, trusting the server's self-signed certificate (agentd,
// like controller-runtime, makes one when given none).
package scrape

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"time"
)

var client = &http.Client{
	Timeout:   20 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
}

// Do sends method to url with token as its bearer token ("" sends none), and returns the
// answer's status code and body.
func Do(ctx context.Context, method, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
