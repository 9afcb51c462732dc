package io.bitroute.realtime;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * One loaded {@link NativeRouter} table, reference counted so that its handle is freed only
 * when no task uses it: the view holds one reference while the table is current
 * ({@link RoutingView} drops it when it swaps in another), each task holds one while it routes
 * ({@link #tryAcquire} ... {@link #close}). The count never rises again from 0, so a freed
 * handle is never handed out.
 */
final class RoutingTable implements AutoCloseable {
    private final long handle;
    private final AtomicInteger references = new AtomicInteger(1);

    /** A table holding {@code handle} (from {@link NativeRouter#load}), its one reference the
     *  caller's. */
    RoutingTable(long handle) {
        this.handle = handle;
    }

    long handle() {
        return handle;
    }

    /** Take a reference for a task; false when the table was already freed (the caller
     *  reads the view's current table again). */
    boolean tryAcquire() {
        while (true) {
            int n = references.get();
            if (n == 0) {
                return false;
            }
            if (references.compareAndSet(n, n + 1)) {
                return true;
            }
        }
    }

    /** Drop a reference; the last one frees the native table. */
    @Override
    public void close() {
        if (references.decrementAndGet() == 0) {
            NativeRouter.free(handle);
        }
    }
}
