package io.gpumemd.server.books;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.PriorityQueue;
import java.util.function.Predicate;

/**
 * One page of a listing: the first {@code size} items after a cursor in a total order, out of
 * a live collection that is never copied or sorted whole. Selecting a page is one pass with a
 * bounded heap, O(n log size), so listing 100,000 sessions in pages of 1000 costs 100 passes,
 * not 100 sorts, and nothing is held between pages: the cursor is the last item's sort key, so
 * items that come or go between pages neither shift nor repeat the others.
 *
 * @param items the page, in order
 * @param total items visible to the caller in all (those before the cursor included)
 * @param more true when items after this page exist
 */
public record Page<T>(List<T> items, long total, boolean more) {

  /**
   * @param all the live items (a concurrent collection: items may come and go meanwhile)
   * @param visible what the caller may see (and the request's filters)
   * @param afterCursor true for items after the cursor (all of them for the first page)
   */
  public static <T> Page<T> select(Iterable<T> all, Predicate<T> visible, Predicate<T> afterCursor, Comparator<T> order,
      int size) {
    PriorityQueue<T> smallest = new PriorityQueue<>(Math.min(size, 1024) + 1, order.reversed());
    long total = 0;
    long after = 0;
    for (T item : all) {
      if (!visible.test(item)) {
        continue;
      }
      total++;
      if (!afterCursor.test(item)) {
        continue;
      }
      after++;
      if (smallest.size() < size) {
        smallest.add(item);
      } else if (order.compare(item, smallest.peek()) < 0) {
        smallest.poll();
        smallest.add(item);
      }
    }
    List<T> items = new ArrayList<>(smallest);
    items.sort(order);
    return new Page<>(Collections.unmodifiableList(items), total, after > items.size());
  }
}
