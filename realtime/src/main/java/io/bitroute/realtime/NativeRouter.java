package io.bitroute.realtime;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * The Rust kernel's routing table over JNI (realtime contract, section 1).
 *
 * <p>The library, {@code libbitroute_jni.so}, travels inside this class's jar at
 * {@link #LIBRARY_RESOURCE}: the static initializer copies it to a temporary file and
 * {@code System.load}s it, once per JVM (a class is initialised once). A jar built without
 * it fails here, naming the resource, rather than at the first native call.
 *
 * <p>A handle from {@link #load} is an immutable table: {@link #route} may be called on it
 * from several task threads at once; {@link #free} is called once, when no task uses it
 * ({@link RoutingTable} counts the users).
 */
public final class NativeRouter {
    /** Where the build (streaming/realtime/jar.py) puts the JNI library in the jar. */
    public static final String LIBRARY_RESOURCE = "/native/linux-x86_64/libbitroute_jni.so";

    static {
        loadLibrary();
    }

    private NativeRouter() {
    }

    /** Build a routing table from UTF-8 JSON (contract section 2). Returns a handle != 0.
     *  Throws IllegalArgumentException(message) for a table it cannot read. */
    static native long load(byte[] tableJson);

    /** Free a handle from load (once; never used after). */
    static native void free(long handle);

    /** Route one publish with Kafka timestamp {@code publishedMs} at {@code nowMs} (epoch ms,
     *  for its expiry): the encoded outcome ({@link RouteOutcome#decode}). */
    static native byte[] route(long handle, byte[] key, String[] headerNames,
                               byte[][] headerValues, String messageId, long publishedMs,
                               long nowMs);

    /** A new, empty subscription set (the routing view's subscriptions, kept parsed between
     *  tables): a handle != 0, freed by {@link #freeSet}. A set is used by one thread at a time. */
    static native long newSet();

    /** Hold {@code subscriptionJson} (one entry of a table's {@code subscriptions}) as
     *  {@code id}'s; true when that changed the set. Throws IllegalArgumentException(message)
     *  for JSON it cannot read (the set is left as it was). */
    static native boolean put(long set, String id, byte[] subscriptionJson);

    /** Drop {@code id}'s subscription; true when the set held one. */
    static native boolean remove(long set, String id);

    /** How many subscriptions the set holds. */
    static native int size(long set);

    /** A table (a handle as {@link #load}'s) of {@code tableFieldsJson} (a table's JSON, its
     *  subscriptions left out) with the set's subscriptions: the outcomes of {@link #load} of
     *  the same table. Only the subscriptions changed since the set's last whole table are
     *  compiled, layered over it, when they are few and none is in a shared group
     *  (bitroute-core {@code SubscriptionSet}). Throws IllegalArgumentException(message) for
     *  a table it cannot make. */
    static native long build(long set, byte[] tableFieldsJson);

    /** Free a handle from newSet (once; never used after). */
    static native void freeSet(long set);

    private static void loadLibrary() {
        try (InputStream in = NativeRouter.class.getResourceAsStream(LIBRARY_RESOURCE)) {
            if (in == null) {
                throw new UnsatisfiedLinkError("bitroute's JNI library is not in the jar of "
                        + NativeRouter.class.getName() + ": resource " + LIBRARY_RESOURCE
                        + " is missing (build the jar with streaming/realtime/jar.py)");
            }
            Path file = Files.createTempFile("libbitroute_jni", ".so");
            file.toFile().deleteOnExit();
            Files.copy(in, file, StandardCopyOption.REPLACE_EXISTING);
            System.load(file.toAbsolutePath().toString());
        } catch (IOException e) {
            throw new UnsatisfiedLinkError("cannot extract " + LIBRARY_RESOURCE
                    + " to a temporary file: " + e);
        }
    }
}
