package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// readKeyFile returns the cluster key stored in path ("" → empty key).
func readKeyFile(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster key: %w", err)
	}
	k := bytes.TrimSpace(b)
	if len(k) == 0 {
		return nil, fmt.Errorf("cluster key file %s is empty", path)
	}
	return k, nil
}

// ensureKeyFile loads the key in path, creating a random one (mode 0600) on
// first use.
func ensureKeyFile(path string) ([]byte, error) {
	k, err := readKeyFile(path)
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generate cluster key: %w", err)
	}
	k = []byte(hex.EncodeToString(raw))
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, append(k, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("write cluster key: %w", err)
	}
	return k, nil
}
