"""Storage backends of the server: a registry root opened by its URL (a local directory or s3://)."""
