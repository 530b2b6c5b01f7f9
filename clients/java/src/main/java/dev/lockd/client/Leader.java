package dev.lockd.client;

/**
 * Who leads an election: its campaign value (owner string) and its fencing token (a larger token
 * is a later term). {@code sessionId} is empty unless the client presents the admin token.
 */
public record Leader(String value, long token, String sessionId) {}
