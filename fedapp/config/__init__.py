"""Configuration: the common run-config keys (`run`) and how every key is declared and validated (`keys`)."""
