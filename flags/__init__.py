"""What a user can set: absl flag definitions and their validation into plain values."""
