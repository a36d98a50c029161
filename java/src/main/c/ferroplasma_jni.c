/* The JNI side of the Java client (io.ferroplasma.plasma.NativeStore): each
 * native method is one call of the C library (ferroplasma.h), which this
 * file is linked with statically. Handles cross into Java as jlong; ids as
 * 20-byte arrays (several ids packed into one array for batches). A failed
 * call throws the Java exception of its status (PlasmaClientException, or
 * its subclasses DuplicateObjectException and PlasmaOutOfMemoryException)
 * with fp_last_error()'s message; nothing here aborts the JVM. */
#include <jni.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferroplasma.h>

#define ID_SIZE 20

static jclass client_exception;    /* PlasmaClientException */
static jclass duplicate_exception; /* DuplicateObjectException */
static jclass oom_exception;       /* PlasmaOutOfMemoryException */

static jclass global_class(JNIEnv *env, const char *name) {
  jclass local = (*env)->FindClass(env, name);
  if (local == NULL) return NULL;
  jclass global = (jclass)(*env)->NewGlobalRef(env, local);
  (*env)->DeleteLocalRef(env, local);
  return global;
}

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
  (void)reserved;
  JNIEnv *env = NULL;
  if ((*vm)->GetEnv(vm, (void **)&env, JNI_VERSION_1_8) != JNI_OK) return JNI_ERR;
  client_exception = global_class(env, "io/ferroplasma/plasma/exceptions/PlasmaClientException");
  duplicate_exception =
      global_class(env, "io/ferroplasma/plasma/exceptions/DuplicateObjectException");
  oom_exception = global_class(env, "io/ferroplasma/plasma/exceptions/PlasmaOutOfMemoryException");
  if (!client_exception || !duplicate_exception || !oom_exception) return JNI_ERR;
  return JNI_VERSION_1_8;
}

/* Throws the exception for `st` (not FP_OK) and returns 1; 0 for FP_OK. */
static int fail(JNIEnv *env, fp_status st) {
  if (st == FP_OK) return 0;
  if ((*env)->ExceptionCheck(env)) return 1;
  jclass cls = st == FP_OBJECT_EXISTS ? duplicate_exception
               : st == FP_STORE_FULL  ? oom_exception
                                      : client_exception;
  jmethodID ctor = (*env)->GetMethodID(env, cls, "<init>", "(ILjava/lang/String;)V");
  jstring msg = (*env)->NewStringUTF(env, fp_last_error());
  if (ctor == NULL || msg == NULL) return 1; /* an OutOfMemoryError is pending */
  jthrowable ex = (jthrowable)(*env)->NewObject(env, cls, ctor, (jint)st, msg);
  if (ex != NULL) (*env)->Throw(env, ex);
  return 1;
}

/* Throws PlasmaClientException(FP_INVALID_ARGUMENT) with `msg`. */
static void invalid(JNIEnv *env, const char *msg) {
  jmethodID ctor =
      (*env)->GetMethodID(env, client_exception, "<init>", "(ILjava/lang/String;)V");
  jstring s = (*env)->NewStringUTF(env, msg);
  if (ctor == NULL || s == NULL) return;
  jthrowable ex = (jthrowable)(*env)->NewObject(env, client_exception, ctor,
                                                (jint)FP_INVALID_ARGUMENT, s);
  if (ex != NULL) (*env)->Throw(env, ex);
}

/* Reads a 20-byte id; 0 (with an exception pending) if it is not one. */
static int read_id(JNIEnv *env, jbyteArray a, fp_object_id *out) {
  if (a == NULL) {
    invalid(env, "object id is null");
    return 0;
  }
  jsize n = (*env)->GetArrayLength(env, a);
  if (n != ID_SIZE) {
    char msg[96];
    snprintf(msg, sizeof msg, "an object id is 20 bytes, got %d", (int)n);
    invalid(env, msg);
    return 0;
  }
  (*env)->GetByteArrayRegion(env, a, 0, ID_SIZE, (jbyte *)out->bytes);
  return 1;
}

static fp_client *C(jlong h) { return (fp_client *)(intptr_t)h; }
static fp_buffer *B(jlong h) { return (fp_buffer *)(intptr_t)h; }
static fp_mut_buffer *M(jlong h) { return (fp_mut_buffer *)(intptr_t)h; }
static jlong H(const void *p) { return (jlong)(intptr_t)p; }

#define NATIVE(ret, name) JNIEXPORT ret JNICALL Java_io_ferroplasma_plasma_NativeStore_##name

NATIVE(jlong, connect)(JNIEnv *env, jclass cls, jstring socket) {
  (void)cls;
  const char *path = socket ? (*env)->GetStringUTFChars(env, socket, NULL) : NULL;
  if (socket && path == NULL) return 0;
  fp_client *c = NULL;
  fp_status st = fp_connect(path, &c);
  if (path) (*env)->ReleaseStringUTFChars(env, socket, path);
  return fail(env, st) ? 0 : H(c);
}

NATIVE(void, disconnect)(JNIEnv *env, jclass cls, jlong c) {
  (void)cls;
  fail(env, fp_disconnect(C(c)));
}

NATIVE(jlong, capacity)(JNIEnv *env, jclass cls, jlong c) {
  (void)cls;
  uint64_t cap = 0;
  return fail(env, fp_capacity(C(c), &cap)) ? 0 : (jlong)cap;
}

/* Copies a Java array's bytes for the duration of a call. */
typedef struct {
  jbyte *p;
  jsize n;
} bytes;

static int get_bytes(JNIEnv *env, jbyteArray a, bytes *out) {
  out->p = NULL;
  out->n = 0;
  if (a == NULL) return 1;
  out->n = (*env)->GetArrayLength(env, a);
  if (out->n == 0) return 1;
  out->p = (*env)->GetByteArrayElements(env, a, NULL);
  return out->p != NULL;
}

static void put_bytes(JNIEnv *env, jbyteArray a, bytes *b) {
  if (b->p) (*env)->ReleaseByteArrayElements(env, a, b->p, JNI_ABORT);
}

NATIVE(jlong, create)(JNIEnv *env, jclass cls, jlong c, jbyteArray id, jlong size,
                      jbyteArray meta) {
  (void)cls;
  fp_object_id oid;
  if (!read_id(env, id, &oid)) return 0;
  if (size < 0) {
    invalid(env, "an object's size cannot be negative");
    return 0;
  }
  bytes m;
  if (!get_bytes(env, meta, &m)) return 0;
  fp_mut_buffer *out = NULL;
  fp_status st = fp_create(C(c), &oid, (uint64_t)size, (const uint8_t *)m.p, (size_t)m.n, &out);
  put_bytes(env, meta, &m);
  return fail(env, st) ? 0 : H(out);
}

NATIVE(jobject, mutBuffer)(JNIEnv *env, jclass cls, jlong m) {
  (void)cls;
  uint8_t *data = fp_mut_buffer_data(M(m));
  uint64_t size = fp_mut_buffer_size(M(m));
  if (data == NULL) {
    fail(env, FP_INVALID_ARGUMENT);
    return NULL;
  }
  return (*env)->NewDirectByteBuffer(env, data, (jlong)size);
}

NATIVE(jlong, seal)(JNIEnv *env, jclass cls, jlong c, jlong m, jboolean keep) {
  (void)cls;
  fp_buffer *out = NULL;
  fp_status st = fp_seal(C(c), M(m), keep ? &out : NULL);
  return fail(env, st) ? 0 : H(out);
}

NATIVE(void, abort)(JNIEnv *env, jclass cls, jlong c, jlong m) {
  (void)cls;
  fail(env, fp_abort(C(c), M(m)));
}

/* Objects up to this size go in one message (fp_create_and_seal), copied
 * out of the Java array on the stack; larger ones are created and copied
 * straight into the store (one copy, no temporary). */
#define SMALL_PUT 4096

NATIVE(void, createAndSeal)(JNIEnv *env, jclass cls, jlong c, jbyteArray id, jbyteArray data,
                            jbyteArray meta) {
  (void)cls;
  fp_object_id oid;
  if (!read_id(env, id, &oid)) return;
  jsize n = data ? (*env)->GetArrayLength(env, data) : 0;
  bytes m;
  if (!get_bytes(env, meta, &m)) return;
  fp_status st;
  if (n <= SMALL_PUT) {
    uint8_t small[SMALL_PUT];
    if (n > 0) (*env)->GetByteArrayRegion(env, data, 0, n, (jbyte *)small);
    st = fp_create_and_seal(C(c), &oid, small, (size_t)n, (const uint8_t *)m.p, (size_t)m.n);
  } else {
    fp_mut_buffer *draft = NULL;
    st = fp_create(C(c), &oid, (uint64_t)n, (const uint8_t *)m.p, (size_t)m.n, &draft);
    if (st == FP_OK) {
      (*env)->GetByteArrayRegion(env, data, 0, n, (jbyte *)fp_mut_buffer_data(draft));
      st = fp_seal(C(c), draft, NULL);
    }
  }
  put_bytes(env, meta, &m);
  fail(env, st);
}

/* Copies the `n` ids packed in `ids` into `small` (room for SMALL ids) or,
 * for more, a malloc'd array (free it with free_ids). GetByteArrayRegion
 * rather than GetByteArrayElements: no allocation for a few ids. */
enum { SMALL = 16 };

static fp_object_id *read_ids(JNIEnv *env, jbyteArray ids, jint n, fp_object_id *small) {
  if (ids == NULL || n < 0 || n > INT32_MAX / ID_SIZE ||
      (*env)->GetArrayLength(env, ids) != (jsize)((int64_t)n * ID_SIZE)) {
    invalid(env, "ids must be 20 bytes each");
    return NULL;
  }
  fp_object_id *out = n <= SMALL ? small : malloc(sizeof(fp_object_id) * (size_t)n);
  if (out == NULL) {
    invalid(env, "out of memory");
    return NULL;
  }
  (*env)->GetByteArrayRegion(env, ids, 0, n * ID_SIZE, (jbyte *)out);
  return out;
}

static void free_ids(fp_object_id *ids, const fp_object_id *small) {
  if (ids != small) free(ids);
}

/* out[i]: buffer i's handle (0: not sealed in time); parts[4i..4i+3]: its
 * data address and size, metadata address and size (fp_get_views). */
NATIVE(void, get)(JNIEnv *env, jclass cls, jlong c, jbyteArray ids, jint n, jlong timeout_ms,
                  jlongArray out, jlongArray parts) {
  (void)cls;
  if (out == NULL || parts == NULL || (*env)->GetArrayLength(env, out) < n ||
      (*env)->GetArrayLength(env, parts) / 4 < n) {
    invalid(env, "no room for the buffers");
    return;
  }
  fp_object_id small_ids[SMALL];
  fp_object_id *oids = read_ids(env, ids, n, small_ids);
  if (oids == NULL) return;
  fp_buffer *small_bufs[SMALL];
  fp_buffer_view small_views[SMALL];
  jlong small_h[SMALL * 5];
  int big = n > SMALL;
  fp_buffer **bufs = big ? malloc(sizeof(fp_buffer *) * (size_t)n) : small_bufs;
  fp_buffer_view *views = big ? malloc(sizeof(fp_buffer_view) * (size_t)n) : small_views;
  jlong *h = big ? malloc(sizeof(jlong) * (size_t)n * 5) : small_h;
  if (bufs == NULL || views == NULL || h == NULL) {
    free_ids(oids, small_ids);
    if (big) {
      free(bufs);
      free(views);
      free(h);
    }
    invalid(env, "out of memory");
    return;
  }
  fp_status st = fp_get_views(C(c), oids, (size_t)n, timeout_ms, bufs, views);
  free_ids(oids, small_ids);
  if (!fail(env, st)) {
    jlong *p = h + n;
    for (jint i = 0; i < n; i++) {
      h[i] = H(bufs[i]);
      p[4 * i] = H(views[i].data);
      p[4 * i + 1] = (jlong)views[i].size;
      p[4 * i + 2] = H(views[i].metadata);
      p[4 * i + 3] = (jlong)views[i].metadata_size;
    }
    (*env)->SetLongArrayRegion(env, out, 0, n, h);
    (*env)->SetLongArrayRegion(env, parts, 0, 4 * n, p);
  }
  if (big) {
    free(bufs);
    free(views);
    free(h);
  }
}

/* out: data address, data size, metadata address, metadata size. */
NATIVE(void, bufferParts)(JNIEnv *env, jclass cls, jlong b, jlongArray out) {
  (void)cls;
  const uint8_t *data = fp_buffer_data(B(b));
  if (data == NULL) {
    fail(env, FP_INVALID_ARGUMENT);
    return;
  }
  jlong parts[4] = {H(data), (jlong)fp_buffer_size(B(b)), H(fp_buffer_metadata(B(b))),
                    (jlong)fp_buffer_metadata_size(B(b))};
  (*env)->SetLongArrayRegion(env, out, 0, 4, parts);
}

NATIVE(jobject, wrap)(JNIEnv *env, jclass cls, jlong address, jlong size) {
  (void)cls;
  static uint8_t empty;
  void *p = address ? (void *)(intptr_t)address : &empty;
  return (*env)->NewDirectByteBuffer(env, p, size);
}

NATIVE(void, release)(JNIEnv *env, jclass cls, jlong b) {
  (void)cls;
  fail(env, fp_buffer_release(B(b)));
}

NATIVE(void, releaseId)(JNIEnv *env, jclass cls, jlong c, jbyteArray id) {
  (void)cls;
  fp_object_id oid;
  if (read_id(env, id, &oid)) fail(env, fp_release(C(c), &oid));
}

NATIVE(jboolean, contains)(JNIEnv *env, jclass cls, jlong c, jbyteArray id, jboolean deleting) {
  (void)cls;
  fp_object_id oid;
  if (!read_id(env, id, &oid)) return JNI_FALSE;
  bool has = false;
  fp_status st =
      deleting ? fp_contains_deleting(C(c), &oid, &has) : fp_contains(C(c), &oid, &has);
  return fail(env, st) ? JNI_FALSE : (has ? JNI_TRUE : JNI_FALSE);
}

NATIVE(void, delete)(JNIEnv *env, jclass cls, jlong c, jbyteArray ids, jint n) {
  (void)cls;
  fp_object_id small_ids[SMALL];
  fp_object_id *oids = read_ids(env, ids, n, small_ids);
  if (oids == NULL) return;
  fp_status st = fp_delete(C(c), oids, (size_t)n, NULL);
  free_ids(oids, small_ids);
  fail(env, st);
}

NATIVE(jlong, evict)(JNIEnv *env, jclass cls, jlong c, jlong num_bytes) {
  (void)cls;
  uint64_t freed = 0;
  if (num_bytes < 0) num_bytes = 0;
  return fail(env, fp_evict(C(c), (uint64_t)num_bytes, &freed, NULL)) ? 0 : (jlong)freed;
}

/* Every object's id, packed, and in `sizes` (if not null) data size,
 * metadata size, references, sealed (0/1) and delete pending (0/1). */
NATIVE(jbyteArray, list)(JNIEnv *env, jclass cls, jlong c, jobjectArray details) {
  (void)cls;
  fp_object_info *infos = NULL;
  size_t n = 0;
  if (fail(env, fp_list(C(c), &infos, &n))) return NULL;
  jbyteArray ids = n * ID_SIZE > INT32_MAX ? NULL : (*env)->NewByteArray(env, (jsize)(n * ID_SIZE));
  jlongArray info = ids ? (*env)->NewLongArray(env, (jsize)(n * 5)) : NULL;
  if (ids && info) {
    for (size_t i = 0; i < n; i++) {
      jlong row[5] = {(jlong)infos[i].data_size, (jlong)infos[i].metadata_size,
                      (jlong)infos[i].ref_count, infos[i].sealed, infos[i].delete_pending};
      (*env)->SetByteArrayRegion(env, ids, (jsize)(i * ID_SIZE), ID_SIZE,
                                 (const jbyte *)infos[i].id.bytes);
      (*env)->SetLongArrayRegion(env, info, (jsize)(i * 5), 5, row);
    }
    if (details != NULL) (*env)->SetObjectArrayElement(env, details, 0, info);
  } else if (!(*env)->ExceptionCheck(env)) {
    invalid(env, "too many objects for one Java array");
  }
  fp_list_free(infos, n);
  return ids;
}

NATIVE(jbyteArray, hash)(JNIEnv *env, jclass cls, jlong b) {
  (void)cls;
  uint8_t digest[8];
  if (fail(env, fp_buffer_hash(B(b), digest))) return NULL;
  jbyteArray a = (*env)->NewByteArray(env, 8);
  if (a) (*env)->SetByteArrayRegion(env, a, 0, 8, (const jbyte *)digest);
  return a;
}

/* out: kind, version, payload address, payload size, buffer count. */
NATIVE(void, layout)(JNIEnv *env, jclass cls, jlong b, jlongArray out) {
  (void)cls;
  fp_layout l;
  if (fail(env, fp_object_layout(B(b), &l))) return;
  jlong v[5] = {(jlong)l.kind, l.version, H(l.payload), (jlong)l.payload_size, l.buffer_count};
  (*env)->SetLongArrayRegion(env, out, 0, 5, v);
}

/* out: address and size of out-of-band buffer i. */
NATIVE(void, layoutBuffer)(JNIEnv *env, jclass cls, jlong b, jint i, jlongArray out) {
  (void)cls;
  const uint8_t *data = NULL;
  uint64_t size = 0;
  if (i < 0) {
    invalid(env, "a buffer index cannot be negative");
    return;
  }
  if (fail(env, fp_layout_buffer(B(b), (uint32_t)i, &data, &size))) return;
  jlong v[2] = {H(data), (jlong)size};
  (*env)->SetLongArrayRegion(env, out, 0, 2, v);
}

/* Returns the typestr; out: item size, ndim, Fortran order (0/1), data
 * address, data size, then the ndim dimensions. */
NATIVE(jstring, ndarray)(JNIEnv *env, jclass cls, jlong b, jlongArray out) {
  (void)cls;
  fp_ndarray a;
  if (fail(env, fp_ndarray_info(B(b), &a))) return NULL;
  jlong v[5 + FP_MAX_DIMS];
  v[0] = (jlong)a.itemsize;
  v[1] = a.ndim;
  v[2] = a.fortran_order;
  v[3] = H(a.data);
  v[4] = (jlong)a.size;
  for (uint32_t i = 0; i < a.ndim && i < FP_MAX_DIMS; i++) v[5 + i] = (jlong)a.shape[i];
  (*env)->SetLongArrayRegion(env, out, 0, 5 + (jsize)a.ndim, v);
  return (*env)->NewStringUTF(env, a.typestr);
}

/* capacity, used, objects, sealed, referenced, clients, evictions, evicted bytes */
NATIVE(jlongArray, stats)(JNIEnv *env, jclass cls, jlong c) {
  (void)cls;
  fp_stats s;
  if (fail(env, fp_get_stats(C(c), &s))) return NULL;
  jlong v[8] = {(jlong)s.capacity, (jlong)s.used, (jlong)s.objects, (jlong)s.sealed_objects,
                (jlong)s.referenced_objects, (jlong)s.clients, (jlong)s.evictions,
                (jlong)s.evicted_bytes};
  jlongArray a = (*env)->NewLongArray(env, 8);
  if (a) (*env)->SetLongArrayRegion(env, a, 0, 8, v);
  return a;
}

NATIVE(jbyteArray, randomId)(JNIEnv *env, jclass cls) {
  (void)cls;
  fp_object_id id = fp_object_id_random();
  jbyteArray a = (*env)->NewByteArray(env, ID_SIZE);
  if (a) (*env)->SetByteArrayRegion(env, a, 0, ID_SIZE, (const jbyte *)id.bytes);
  return a;
}
