"""The service side: wire protocol, sessions, acceptance math and target backends."""
