package dev.lockd.client;

/**
 * Which lease a hold follows, as of its grant ({@link GroupLeases#granted}).
 *
 * @param group the lock group that granted it
 * @param groupMoves the group's move count at the grant
 * @param epoch the group's lease epoch at the grant (bumped when the client learns that lease
 *     ended)
 * @param allEpoch {@code GroupLeases.allEpoch} at the grant (bumped when the session-wide
 *     deadline restarts after it had passed): a hold that follows it is lost once it differs
 */
record HoldLease(int group, long groupMoves, int epoch, int allEpoch) {}
