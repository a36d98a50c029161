/* Per-call cost of the C library (bench/calls.py runs it; the same
 * measures in every language, see that file):
 *   calls SOCKET   prints {"get_ns":..,"contains_ns":..,"create_seal_ns":..,"batch_us":..} */
#define _POSIX_C_SOURCE 199309L
#include <ferroplasma.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BLOCKS 200
#define PER_BLOCK 100
#define BATCH 1000
#define BATCH_REPS 50

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

#define CHECK(call)                                                  \
  do {                                                               \
    if ((call) != FP_OK) {                                           \
      fprintf(stderr, "%s: %s\n", #call, fp_last_error());           \
      exit(1);                                                       \
    }                                                                \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: calls SOCKET\n");
    return 2;
  }
  fp_client *c = NULL;
  CHECK(fp_connect(argv[1], &c));
  unsigned char payload[64] = {1};
  fp_object_id single = fp_object_id_random();
  CHECK(fp_create_and_seal(c, &single, payload, 64, NULL, 0));
  static fp_object_id batch[BATCH];
  static fp_buffer *bufs[BATCH];
  for (int i = 0; i < BATCH; i++) {
    batch[i] = fp_object_id_random();
    CHECK(fp_create_and_seal(c, &batch[i], payload, 64, NULL, 0));
  }
  double t[BLOCKS];
  unsigned sink = 0;

  for (int b = 0; b < BLOCKS; b++) {
    double t0 = now_ns();
    for (int i = 0; i < PER_BLOCK; i++) {
      fp_buffer *buf = NULL;
      CHECK(fp_get(c, &single, 1, 0, &buf));
      sink += fp_buffer_data(buf)[0];
      fp_buffer_release(buf);
    }
    t[b] = (now_ns() - t0) / PER_BLOCK;
  }
  double get_ns = median(t, BLOCKS);

  for (int b = 0; b < BLOCKS; b++) {
    double t0 = now_ns();
    for (int i = 0; i < PER_BLOCK; i++) {
      bool has = false;
      CHECK(fp_contains(c, &single, &has));
      sink += has;
    }
    t[b] = (now_ns() - t0) / PER_BLOCK;
  }
  double contains_ns = median(t, BLOCKS);

  fp_object_id fresh[PER_BLOCK];
  for (int b = 0; b < BLOCKS; b++) {
    for (int i = 0; i < PER_BLOCK; i++) fresh[i] = fp_object_id_random();
    double t0 = now_ns();
    for (int i = 0; i < PER_BLOCK; i++) {
      fp_mut_buffer *m = NULL;
      CHECK(fp_create(c, &fresh[i], 64, NULL, 0, &m));
      fp_mut_buffer_data(m)[0] = 1;
      CHECK(fp_seal(c, m, NULL));
    }
    t[b] = (now_ns() - t0) / PER_BLOCK;
    CHECK(fp_delete(c, fresh, PER_BLOCK, NULL));
  }
  double create_seal_ns = median(t, BLOCKS);

  double tb[BATCH_REPS];
  for (int r = 0; r < BATCH_REPS; r++) {
    double t0 = now_ns();
    CHECK(fp_get(c, batch, BATCH, 0, bufs));
    for (int i = 0; i < BATCH; i++) {
      sink += fp_buffer_data(bufs[i])[0];
      fp_buffer_release(bufs[i]);
    }
    tb[r] = (now_ns() - t0) / 1e3;
  }
  double batch_us = median(tb, BATCH_REPS);

  CHECK(fp_delete(c, batch, BATCH, NULL));
  CHECK(fp_delete(c, &single, 1, NULL));
  fp_disconnect(c);
  printf("{\"get_ns\": %.1f, \"contains_ns\": %.1f, \"create_seal_ns\": %.1f, \"batch_us\": %.2f}\n",
         get_ns, contains_ns, create_seal_ns, batch_us);
  return sink == 0xdeadbeef;
}
