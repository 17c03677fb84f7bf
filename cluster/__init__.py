"""Where the cluster comes from, where variables live, and how it shuts down."""
