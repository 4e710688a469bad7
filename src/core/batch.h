/*
 * batch.h -- the batch's internals, shared by batch.c (staging) and
 * cascade.c (the two-level plan of shared prefixes, and attention over a
 * staged batch).
 */
#ifndef PA_BATCH_H
#define PA_BATCH_H

#include "pool.h"

/* One entry of a stage's plan (scratch: a failed stage may leave it half
 * written, so nothing here is needed after the stage returns). */
typedef struct entry {
    pa_seq *seq;
    int32_t fresh;        /* new pages */
    int32_t cow_page;     /* the copy of its shared partial page, or -1 */
    int32_t num_new;
    int32_t pages_after;  /* pages holding its tokens after the step */
    bool cow;
} entry;

/* What pa_batch_unstage needs of an entry of the last successful stage:
 * written only when a stage commits, so a failed stage cannot spoil it. */
typedef struct undo_entry {
    int32_t id;
    int32_t before_len;
    int32_t before_pages;
    int32_t num_new;
    int32_t fresh;
} undo_entry;

/* A node of the trie of the entries' page lists (cascade.c). */
typedef struct pa_cascade_node {
    int32_t depth;    /* pages its members share */
    int32_t parent;   /* -1: the root (depth 0: shares nothing) */
    int32_t size;     /* members below it */
    int32_t direct;   /* members that end here or branch off alone */
    int32_t joined;   /* members of its group */
    int32_t gnode;    /* the node whose group its members join */
    int64_t internal; /* page reads saved by its children's own groups */
    int64_t value;    /* page reads saved below it */
    bool absorbed;    /* all its members join the parent's group */
} pa_cascade_node;

/* The two-level plan of the stage in progress: scratch like `entry`, its
 * summary committed to pa_batch.cascade_info with the stage. */
typedef struct pa_cascade_plan {
    int32_t cap;          /* entries the arrays hold */
    int32_t *prefix;      /* per entry: shared pages (0: none) */
    int32_t *group;       /* per entry: its group, -1: none */
    int32_t *group_lead;  /* per group: an entry whose pages are the group's */
    int32_t *group_pages; /* per group: shared pages */
    int32_t *group_q;     /* per group: its queries, then a running offset */
    int32_t *members, *tmp, *leaf_node, *bucket; /* the automatic planner's */
    pa_cascade_node *nodes;
    struct { int32_t node, a, b, d0; } *stack;
    pa_batch_cascade_info info; /* the summary (last_* unused) */
    bool rows_in_order; /* the groups' query rows are the batch's first shared_q, in order */
} pa_cascade_plan;

struct pa_batch {
    pa_pool *pool;
    pa_device *dev; /* holds a reference */
    void *dev_buf;  /* device buffer of cap_elems int32 */
    int32_t *host_buf; /* staging copy when the device is not host-accessible */
    size_t cap_elems;
    pa_tensor views[PA_BATCH_NUM_FIELDS];
    entry *entries;   /* the plan of the stage in progress */
    undo_entry *undo; /* the last successful stage, for pa_batch_unstage */
    int32_t entry_cap;
    int32_t undo_cap;
    int32_t staged_n; /* entries of the last stage; -1 when there is nothing to undo */
    bool csr;         /* write the CSR arrays */

    bool cascade;                     /* PA_BATCH_CASCADE */
    int64_t cascade_min_saved;        /* pa_batch_set_cascade_min_saved */
    pa_cascade_plan plan;             /* of the stage in progress */
    pa_batch_cascade_info cascade_info; /* of the last successful stage, and the last call */
    pa_batch_info info;               /* the last successful stage's shapes */
    /* device scratch of pa_batch_attention: the shared level's q, out and
     * lse, the suffix level's lse, rotated q; and zeros (the q of the
     * append that runs first when q must be rotated) */
    void *scratch;
    size_t scratch_bytes;
    void *zeros;
    size_t zeros_bytes;
};

/* cascade.c: plans the stage's groups (before its commit: the entries'
 * shared pages lie before their new tokens, so the commit leaves them as
 * they are). labels: maybe, the caller's groups. Fills b->plan. */
pa_status pa_cascade_plan_stage(pa_context *ctx, pa_batch *b, int32_t n, const int32_t *labels);
/* Frees the plan's arrays and the attention scratch. */
void pa_cascade_release(pa_batch *b);

#endif /* PA_BATCH_H */
