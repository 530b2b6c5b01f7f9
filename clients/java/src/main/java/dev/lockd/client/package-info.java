/**
 * The Java client of lockd: one session per {@link dev.lockd.client.LockdClient} over one gRPC
 * {@code Session} stream, fenced locks ({@link dev.lockd.client.Lock}, with a {@code lost()}
 * signal at the local lease deadline), elections ({@link dev.lockd.client.Election}, {@link
 * dev.lockd.client.LeaderLatch}), a mutex ({@link dev.lockd.client.LockdMutex}), watches ({@link
 * dev.lockd.client.Watch}), typed errors ({@link dev.lockd.client.LockdException}) and JDBC fenced
 * writes ({@link dev.lockd.client.Fencing}). See clients/java/README.md.
 */
package dev.lockd.client;
