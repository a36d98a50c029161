/*
 * Every call of libferroplasma against a real store, with its error paths.
 *
 *   test_api SOCKET                 run every check; prints "ok" at the end
 *   test_api SOCKET hold HEX        get object HEX, print "held", wait forever
 *                                   (the test kills it while it holds the object)
 *   test_api NOSUCHSOCKET nostore   connecting fails with FP_STORE_UNAVAILABLE
 */
#define _DEFAULT_SOURCE /* usleep */
#include "ferroplasma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n",         \
                    __FILE__, __LINE__, #cond, fp_last_error());                 \
            failures++;                                                          \
        }                                                                        \
    } while (0)

#define EXPECT(call, status) CHECK((call) == (status))

static void raw_objects(fp_client *c) {
    fp_object_id id = fp_object_id_random();
    const char meta[] = "meta";
    fp_mut_buffer *mb = NULL;
    EXPECT(fp_create(c, &id, 1000, (const uint8_t *)meta, 4, &mb), FP_OK);
    CHECK(fp_mut_buffer_size(mb) == 1000);
    uint8_t *w = fp_mut_buffer_data(mb);
    for (int i = 0; i < 1000; i++) w[i] = (uint8_t)(i * 7);
    /* Not sealed yet: a get that does not wait finds nothing. */
    fp_buffer *none = (fp_buffer *)1;
    EXPECT(fp_get(c, &id, 1, 0, &none), FP_OK);
    CHECK(none == NULL);
    fp_buffer *sealed = NULL;
    EXPECT(fp_seal(c, mb, &sealed), FP_OK);
    CHECK(fp_buffer_size(sealed) == 1000);
    fp_buffer_release(sealed);

    fp_buffer *b = NULL;
    EXPECT(fp_get(c, &id, 1, -1, &b), FP_OK);
    CHECK(b != NULL && fp_buffer_size(b) == 1000);
    CHECK(fp_buffer_metadata_size(b) == 4 && memcmp(fp_buffer_metadata(b), "meta", 4) == 0);
    const uint8_t *r = fp_buffer_data(b);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= r[i] == (uint8_t)(i * 7);
    CHECK(same);
    fp_object_id got = fp_buffer_id(b);
    CHECK(memcmp(got.bytes, id.bytes, 20) == 0);
    fp_layout l;
    EXPECT(fp_object_layout(b, &l), FP_OK);
    CHECK(l.kind == FP_KIND_RAW && l.payload_size == 1000 && l.payload == r);

    bool there = false;
    EXPECT(fp_contains(c, &id, &there), FP_OK);
    CHECK(there);
    EXPECT(fp_release(c, &id), FP_OK); /* held: the buffer is alive */

    /* Deleting an object someone holds is deferred until the release. */
    fp_delete_status st = FP_DELETED;
    EXPECT(fp_delete(c, &id, 1, &st), FP_OK);
    CHECK(st == FP_DEFERRED);
    CHECK(fp_buffer_data(b)[999] == (uint8_t)(999 * 7)); /* still readable */
    EXPECT(fp_contains(c, &id, &there), FP_OK);
    CHECK(!there); /* being deleted */
    EXPECT(fp_contains_deleting(c, &id, &there), FP_OK);
    CHECK(there); /* Plasma's answer: there until the last release */
    uint8_t digest[8] = {0}, none8[8] = {0};
    EXPECT(fp_buffer_hash(b, digest), FP_OK);
    CHECK(memcmp(digest, none8, 8) != 0);
    EXPECT(fp_buffer_hash(b, NULL), FP_INVALID_ARGUMENT);
    EXPECT(fp_buffer_hash(NULL, digest), FP_INVALID_ARGUMENT);
    fp_buffer_release(b);
    EXPECT(fp_release(c, &id), FP_NOT_HELD);
    for (int i = 0; i < 200; i++) { /* the deferred delete completes */
        EXPECT(fp_contains(c, &id, &there), FP_OK);
        if (!there) break;
        usleep(5000);
    }
    CHECK(!there);
    EXPECT(fp_delete(c, &id, 1, &st), FP_OK);
    CHECK(st == FP_NOT_FOUND);

    /* Abort frees the id. */
    EXPECT(fp_create(c, &id, 10, NULL, 0, &mb), FP_OK);
    EXPECT(fp_abort(c, mb), FP_OK);
    EXPECT(fp_contains(c, &id, &there), FP_OK);
    CHECK(!there);

    /* create_and_seal, then the same id again: exists. */
    const char data[] = "hello, store";
    EXPECT(fp_create_and_seal(c, &id, (const uint8_t *)data, sizeof data, NULL, 0), FP_OK);
    EXPECT(fp_create_and_seal(c, &id, (const uint8_t *)data, sizeof data, NULL, 0),
           FP_OBJECT_EXISTS);
    EXPECT(fp_create(c, &id, 10, NULL, 0, &mb), FP_OBJECT_EXISTS);
    EXPECT(fp_delete(c, &id, 1, NULL), FP_OK);
}

static void batched_get_and_list(fp_client *c) {
    enum { N = 100 };
    fp_object_id ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = fp_object_id_random();
        uint64_t v = (uint64_t)i;
        EXPECT(fp_create_and_seal(c, &ids[i], (const uint8_t *)&v, sizeof v, NULL, 0), FP_OK);
    }
    fp_buffer *bufs[N + 1];
    fp_object_id asked[N + 1];
    memcpy(asked, ids, sizeof ids);
    asked[N] = fp_object_id_random(); /* never created */
    EXPECT(fp_get(c, asked, N + 1, 50, bufs), FP_OK);
    for (int i = 0; i < N; i++) {
        uint64_t v;
        CHECK(bufs[i] != NULL && fp_buffer_size(bufs[i]) == 8);
        memcpy(&v, fp_buffer_data(bufs[i]), 8);
        CHECK(v == (uint64_t)i);
        fp_buffer_release(bufs[i]);
    }
    CHECK(bufs[N] == NULL);

    /* fp_get_views: the same buffers, and each one's parts without a call. */
    fp_buffer_view views[N + 1];
    memset(views, 0xff, sizeof views);
    EXPECT(fp_get_views(c, asked, N + 1, 50, bufs, views), FP_OK);
    for (int i = 0; i < N; i++) {
        CHECK(bufs[i] != NULL);
        CHECK(views[i].data == fp_buffer_data(bufs[i]) && views[i].size == 8);
        CHECK(views[i].metadata == fp_buffer_metadata(bufs[i]) && views[i].metadata_size == 0);
        fp_buffer_release(bufs[i]);
    }
    CHECK(bufs[N] == NULL && views[N].data == NULL && views[N].size == 0 &&
          views[N].metadata == NULL && views[N].metadata_size == 0);
    EXPECT(fp_get_views(c, asked, 1, 0, bufs, NULL), FP_OK); /* views are optional */
    fp_buffer_release(bufs[0]);
    EXPECT(fp_get_views(c, asked, 1, 0, NULL, views), FP_INVALID_ARGUMENT);

    fp_object_info *infos = NULL;
    size_t n = 0;
    EXPECT(fp_list(c, &infos, &n), FP_OK);
    CHECK(n >= N);
    size_t found = 0;
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < N; i++)
            if (memcmp(infos[k].id.bytes, ids[i].bytes, 20) == 0 && infos[k].sealed &&
                infos[k].data_size == 8)
                found++;
    CHECK(found == N);
    fp_list_free(infos, n);

    fp_stats s;
    EXPECT(fp_get_stats(c, &s), FP_OK);
    CHECK(s.sealed_objects >= N && s.capacity > 0 && s.clients >= 1);
    uint64_t freed = 0, objects = 0;
    EXPECT(fp_evict(c, 8 * N, &freed, &objects), FP_OK);
    CHECK(freed >= 8 * N && objects >= N);
    EXPECT(fp_delete(c, ids, N, NULL), FP_OK);
}

/* fp_get_held: a batch in one handle, each object released by index, and
 * each one's use ending at its own release while the others stay held. */
static void held_batches(fp_client *c) {
    enum { N = 3 };
    fp_object_id asked[N + 1];
    for (int i = 0; i < N; i++) {
        asked[i] = fp_object_id_random();
        uint64_t v = 10 + (uint64_t)i;
        EXPECT(fp_create_and_seal(c, &asked[i], (const uint8_t *)&v, sizeof v,
                                  (const uint8_t *)"m", i == 0 ? 1 : 0),
               FP_OK);
    }
    asked[N] = fp_object_id_random(); /* never created */
    fp_held *h = NULL;
    fp_buffer_view views[N + 1];
    memset(views, 0xff, sizeof views);
    EXPECT(fp_get_held(c, asked, N + 1, 0, &h, views), FP_OK);
    CHECK(h != NULL);
    for (int i = 0; i < N; i++) {
        uint64_t v = 0;
        CHECK(views[i].data != NULL && views[i].size == 8);
        if (views[i].data != NULL) memcpy(&v, views[i].data, 8);
        CHECK(v == 10 + (uint64_t)i);
    }
    CHECK(views[0].metadata_size == 1 && memcmp(views[0].metadata, "m", 1) == 0);
    CHECK(views[1].metadata_size == 0);
    CHECK(views[N].data == NULL && views[N].size == 0 && views[N].metadata == NULL);

    /* Deleted while held: each waits for its own release. */
    EXPECT(fp_delete(c, asked, N, NULL), FP_OK);
    bool there = false;
    EXPECT(fp_contains_deleting(c, &asked[1], &there), FP_OK);
    CHECK(there);
    EXPECT(fp_held_release(h, 1), FP_OK);
    EXPECT(fp_contains_deleting(c, &asked[1], &there), FP_OK);
    CHECK(!there);
    EXPECT(fp_contains_deleting(c, &asked[0], &there), FP_OK);
    CHECK(there);

    /* Misuse: released twice, not got, out of range. */
    EXPECT(fp_held_release(h, 1), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "released already") != NULL);
    EXPECT(fp_held_release(h, N), FP_INVALID_ARGUMENT);
    EXPECT(fp_held_release(h, N + 1), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "out of the batch") != NULL);
    EXPECT(fp_held_release(NULL, 0), FP_INVALID_ARGUMENT);

    /* The last release frees the batch: using it after is reported. */
    EXPECT(fp_held_release(h, 0), FP_OK);
    EXPECT(fp_held_release(h, 2), FP_OK);
    EXPECT(fp_contains_deleting(c, &asked[0], &there), FP_OK);
    CHECK(!there);
    EXPECT(fp_held_release(h, 2), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "freed already") != NULL);

    /* Nothing got: no batch. Bad pointers: a status. */
    h = (fp_held *)1;
    EXPECT(fp_get_held(c, &asked[N], 1, 0, &h, views), FP_OK);
    CHECK(h == NULL);
    EXPECT(fp_get_held(c, asked, 1, 0, NULL, views), FP_INVALID_ARGUMENT);
    EXPECT(fp_get_held(c, asked, 1, 0, &h, NULL), FP_INVALID_ARGUMENT);
    EXPECT(fp_get_held(c, NULL, 1, 0, &h, views), FP_INVALID_ARGUMENT);
    EXPECT(fp_get_held(c, NULL, 0, 0, &h, NULL), FP_OK);
    CHECK(h == NULL);
}

static void subscriptions(fp_client *c) {
    fp_subscription *sub = NULL;
    EXPECT(fp_subscribe(c, false, &sub), FP_OK);
    CHECK(fp_subscription_fd(sub) >= 0);
    fp_event e;
    EXPECT(fp_subscription_next(sub, 0, &e), FP_TIMEOUT);
    fp_object_id id = fp_object_id_random();
    EXPECT(fp_create_and_seal(c, &id, (const uint8_t *)"abc", 3, (const uint8_t *)"m", 1), FP_OK);
    EXPECT(fp_subscription_next(sub, 5000, &e), FP_OK);
    CHECK(e.kind == FP_EVENT_SEALED && e.data_size == 3 && e.metadata_size == 1);
    CHECK(memcmp(e.id.bytes, id.bytes, 20) == 0);
    EXPECT(fp_delete(c, &id, 1, NULL), FP_OK);
    EXPECT(fp_subscription_next(sub, 5000, &e), FP_OK);
    CHECK(e.kind == FP_EVENT_DELETED && memcmp(e.id.bytes, id.bytes, 20) == 0);
    fp_subscription_close(sub);
}

static void bad_input(fp_client *c) {
    fp_object_id id;
    EXPECT(fp_object_id_from_hex("not hex", &id), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "hex") != NULL || strstr(fp_last_error(), "id") != NULL);
    EXPECT(fp_object_id_from_hex(NULL, &id), FP_INVALID_ARGUMENT);
    char hex[41];
    fp_object_id r = fp_object_id_random();
    EXPECT(fp_object_id_to_hex(r, hex), FP_OK);
    CHECK(strlen(hex) == 40);
    EXPECT(fp_object_id_from_hex(hex, &id), FP_OK);
    CHECK(memcmp(id.bytes, r.bytes, 20) == 0);

    /* NULL handles and pointers, sizes that do not match. */
    bool there;
    EXPECT(fp_contains(NULL, &id, &there), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "NULL") != NULL);
    EXPECT(fp_contains(c, NULL, &there), FP_INVALID_ARGUMENT);
    EXPECT(fp_contains(c, &id, NULL), FP_INVALID_ARGUMENT);
    EXPECT(fp_create_and_seal(c, &id, NULL, 10, NULL, 0), FP_INVALID_ARGUMENT);
    EXPECT(fp_seal(c, NULL, NULL), FP_INVALID_ARGUMENT);
    EXPECT(fp_abort(c, NULL), FP_INVALID_ARGUMENT);
    fp_buffer *out;
    EXPECT(fp_get(c, NULL, 1, 0, &out), FP_INVALID_ARGUMENT);
    EXPECT(fp_release(c, &id), FP_NOT_HELD);
    CHECK(fp_buffer_size(NULL) == 0 && fp_buffer_data(NULL) == NULL);
    fp_buffer_release(NULL);
    fp_layout l;
    EXPECT(fp_object_layout(NULL, &l), FP_INVALID_ARGUMENT);

    /* Store full: an object larger than the store, and one that does not
       fit beside objects in use. */
    uint64_t cap = 0;
    EXPECT(fp_capacity(c, &cap), FP_OK);
    fp_mut_buffer *mb = NULL;
    /* Larger than the whole store: FP_STORE_FULL, with a message that says
       so (as the header documents), however large. */
    uint64_t sizes[] = {cap * 2, (uint64_t)1 << 40, UINT64_MAX};
    for (int i = 0; i < 3; i++) {
        EXPECT(fp_create(c, &id, sizes[i], NULL, 0, &mb), FP_STORE_FULL);
        CHECK(strstr(fp_last_error(), "more than the whole store") != NULL);
    }
    /* More than one message carries: created and sealed all the same. */
    static uint8_t nine_mib[9 << 20];
    EXPECT(fp_create_and_seal(c, &id, nine_mib, sizeof(nine_mib), NULL, 0), FP_OK);
    EXPECT(fp_delete(c, &id, 1, NULL), FP_OK);
    fp_object_id parsed;
    EXPECT(fp_object_id_from_hex("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", &parsed),
           FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "40 hex digits") != NULL);
    fp_mut_buffer *half = NULL;
    fp_object_id a = fp_object_id_random(), b = fp_object_id_random();
    EXPECT(fp_create(c, &a, cap * 6 / 10, NULL, 0, &half), FP_OK);
    EXPECT(fp_create(c, &b, cap * 6 / 10, NULL, 0, &mb), FP_STORE_FULL);
    CHECK(strlen(fp_last_error()) > 0);
    EXPECT(fp_abort(c, half), FP_OK);
    CHECK(strcmp(fp_status_name(FP_STORE_FULL), "FP_STORE_FULL") == 0);
}

/* Handles used after they were freed get a status, not freed memory. */
static void misuse(fp_client *c) {
    fp_object_id id = fp_object_id_random();
    fp_mut_buffer *mb = NULL;
    EXPECT(fp_create(c, &id, 10, NULL, 0, &mb), FP_OK);
    fp_buffer *b = NULL;
    EXPECT(fp_seal(c, mb, &b), FP_OK);
    EXPECT(fp_seal(c, mb, NULL), FP_INVALID_ARGUMENT); /* sealed twice */
    CHECK(strstr(fp_last_error(), "freed already") != NULL);
    EXPECT(fp_abort(c, mb), FP_INVALID_ARGUMENT);      /* aborted after its seal */
    CHECK(fp_mut_buffer_data(mb) == NULL && fp_mut_buffer_size(mb) == 0);
    EXPECT(fp_buffer_release(b), FP_OK);
    EXPECT(fp_buffer_release(b), FP_INVALID_ARGUMENT); /* released twice */
    CHECK(fp_buffer_size(b) == 0 && fp_buffer_data(b) == NULL);
    CHECK(strstr(fp_last_error(), "freed already") != NULL);
    uint8_t digest[8];
    EXPECT(fp_buffer_hash(b, digest), FP_INVALID_ARGUMENT);
    fp_layout l;
    EXPECT(fp_object_layout(b, &l), FP_INVALID_ARGUMENT);
    EXPECT(fp_buffer_release(NULL), FP_OK);

    fp_subscription *sub = NULL;
    EXPECT(fp_subscribe(c, false, &sub), FP_OK);
    EXPECT(fp_subscription_close(sub), FP_OK);
    EXPECT(fp_subscription_close(sub), FP_INVALID_ARGUMENT);
    CHECK(fp_subscription_fd(sub) == -1);
    fp_event ev;
    EXPECT(fp_subscription_next(sub, 0, &ev), FP_INVALID_ARGUMENT);

    EXPECT(fp_create(c, &id, 10, NULL, 0, NULL), FP_INVALID_ARGUMENT);
    EXPECT(fp_get(c, &id, 1, 0, NULL), FP_INVALID_ARGUMENT);
}

static int hold(fp_client *c, const char *hex) {
    fp_object_id id;
    if (fp_object_id_from_hex(hex, &id) != FP_OK) return 2;
    fp_buffer *b = NULL;
    if (fp_get(c, &id, 1, 5000, &b) != FP_OK || b == NULL) return 3;
    printf("held %u\n", (unsigned)fp_buffer_data(b)[0]);
    fflush(stdout);
    for (;;) pause();
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_api SOCKET [hold HEX | nostore]\n");
        return 2;
    }
    fp_client *c = NULL;
    if (argc == 3 && strcmp(argv[2], "nostore") == 0) {
        fp_status s = fp_connect(argv[1], &c);
        if (s != FP_STORE_UNAVAILABLE || c != NULL) {
            fprintf(stderr, "connect without a store: %s\n", fp_status_name(s));
            return 1;
        }
        printf("ok: %s\n", fp_last_error());
        return 0;
    }
    if (fp_connect(argv[1], &c) != FP_OK) {
        fprintf(stderr, "connect: %s\n", fp_last_error());
        return 1;
    }
    if (argc == 4 && strcmp(argv[2], "hold") == 0) return hold(c, argv[3]);
    raw_objects(c);
    batched_get_and_list(c);
    held_batches(c);
    subscriptions(c);
    bad_input(c);
    misuse(c);
    EXPECT(fp_disconnect(c), FP_OK);
    EXPECT(fp_disconnect(NULL), FP_OK);
    /* A client used after its disconnect, or disconnected twice: a status. */
    bool there = false;
    fp_object_id any = fp_object_id_random();
    EXPECT(fp_contains(c, &any, &there), FP_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "freed already") != NULL);
    EXPECT(fp_disconnect(c), FP_INVALID_ARGUMENT);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
