/*
 * C reads what Python put, in place:
 *   read_python SOCKET TABLE_HEX ARRAY_HEX
 * prints the table object's kind, whether its Arrow IPC payload lies inside
 * the object and an FNV-1a hash of that payload, then the numpy array's dtype, shape and sum (for
 * float64), and whether its data lies inside the object.
 */
#include "ferroplasma.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    fp_client *c = NULL;
    if (fp_connect(argv[1], &c) != FP_OK) return 1;
    fp_object_id ids[2];
    if (fp_object_id_from_hex(argv[2], &ids[0]) != FP_OK ||
        fp_object_id_from_hex(argv[3], &ids[1]) != FP_OK)
        return 2;
    fp_buffer *b[2] = {NULL, NULL};
    if (fp_get(c, ids, 2, 5000, b) != FP_OK || !b[0] || !b[1]) return 3;

    fp_layout l;
    if (fp_object_layout(b[0], &l) != FP_OK) return 4;
    const uint8_t *lo = fp_buffer_data(b[0]), *hi = lo + fp_buffer_size(b[0]);
    int inside = l.payload >= lo && l.payload + l.payload_size <= hi;
    /* An Arrow IPC stream starts with a continuation marker (0xFFFFFFFF). */
    int ipc = l.payload_size > 4 && memcmp(l.payload, "\xff\xff\xff\xff", 4) == 0;
    /* FNV-1a 64 of the IPC stream, which Python computes over the same bytes. */
    uint64_t h = 1469598103934665603ULL;
    for (uint64_t i = 0; i < l.payload_size; i++) h = (h ^ l.payload[i]) * 1099511628211ULL;
    printf("table kind=%d ipc=%d inside=%d fnv=%016llx\n", (int)l.kind, ipc, inside,
           (unsigned long long)h);

    fp_ndarray a;
    if (fp_ndarray_info(b[1], &a) != FP_OK) {
        fprintf(stderr, "%s\n", fp_last_error());
        return 5;
    }
    double sum = 0;
    if (strcmp(a.typestr, "<f8") == 0)
        for (uint64_t i = 0; i < a.size / 8; i++) sum += ((const double *)a.data)[i];
    lo = fp_buffer_data(b[1]);
    hi = lo + fp_buffer_size(b[1]);
    printf("array %s ndim=%u shape=%llux%llu order=%c sum=%.3f inside=%d\n", a.typestr, a.ndim,
           (unsigned long long)a.shape[0], (unsigned long long)(a.ndim > 1 ? a.shape[1] : 1),
           a.fortran_order ? 'F' : 'C', sum, a.data >= lo && a.data + a.size <= hi);
    fp_buffer_release(b[0]);
    fp_buffer_release(b[1]);
    fp_disconnect(c);
    return 0;
}
