"""Privacy-utility experiments: FFCM and k-FED under differential privacy (`fedapp.privacy.dp`)."""
