"""Tests of `specwire chat` (app/chat/)."""
