"""The order store on PostgreSQL (Aurora PostgreSQL on AWS, embedded PostgreSQL locally): the only
package with SQL in it.

- connection: one connection per process, transactions, and the errors that mean "retry shortly";
- schema: the versioned migrations (yoyo-migrations) in migrations/, and the schema they declare;
- order_repository: shop.domain.orders.OrderRepository, one SQL transaction per change;
- outbox: the outbox rows, written in the writer's transaction and claimed by the polling publisher
  in per-order sequence with FOR UPDATE SKIP LOCKED.
"""
