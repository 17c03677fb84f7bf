"""Tooling around the trainer, never imported by it: process clusters (local and over ssh), the
terminal launcher, fault drills and Kubernetes manifests."""
