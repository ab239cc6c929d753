--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: inbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.inbox (
    consumer text NOT NULL,
    event_id text NOT NULL,
    processed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: order_lines; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.order_lines (
    order_id text NOT NULL,
    line_no smallint NOT NULL,
    sku text NOT NULL,
    quantity integer NOT NULL,
    unit_price bigint NOT NULL,
    CONSTRAINT order_lines_quantity_check CHECK ((quantity > 0)),
    CONSTRAINT order_lines_unit_price_check CHECK ((unit_price >= 0))
);


--
-- Name: orders; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.orders (
    order_id text NOT NULL,
    customer_id text NOT NULL,
    currency text NOT NULL,
    status text NOT NULL,
    version integer NOT NULL,
    total_amount bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    rejection jsonb,
    CONSTRAINT orders_status_check CHECK ((status = ANY (ARRAY['PENDING'::text, 'CONFIRMED'::text, 'REJECTED'::text, 'CANCELLED'::text]))),
    CONSTRAINT orders_version_check CHECK ((version >= 1))
);


--
-- Name: outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox (
    "position" bigint NOT NULL,
    event_id text NOT NULL,
    aggregate_id text NOT NULL,
    sequence integer NOT NULL,
    event_type text NOT NULL,
    envelope json NOT NULL,
    trace_header text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    published_at timestamp with time zone,
    parked_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    redriven_at timestamp with time zone,
    discarded_at timestamp with time zone,
    discarded_by text,
    discard_reason text,
    pending_since timestamp with time zone,
    CONSTRAINT outbox_check CHECK (((published_at IS NULL) OR (parked_at IS NULL))),
    CONSTRAINT outbox_sequence_check CHECK ((sequence >= 1))
);


--
-- Name: outbox_position_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.outbox ALTER COLUMN "position" ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_position_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: outbox_relay; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_relay (
    singleton boolean DEFAULT true NOT NULL,
    mode text NOT NULL,
    changed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT outbox_relay_mode_check CHECK ((mode = ANY (ARRAY['polling'::text, 'logical'::text]))),
    CONSTRAINT outbox_relay_singleton_check CHECK (singleton)
);


--
-- Name: outbox_replay; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_replay (
    replay_id bigint NOT NULL,
    kind text NOT NULL,
    source_lsn pg_lsn,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    activated_at timestamp with time zone,
    finished_at timestamp with time zone,
    CONSTRAINT outbox_replay_check CHECK (((finished_at IS NULL) OR (activated_at IS NOT NULL))),
    CONSTRAINT outbox_replay_kind_check CHECK ((kind = ANY (ARRAY['replay'::text, 'handover'::text, 'spill'::text])))
);


--
-- Name: outbox_replay_replay_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.outbox_replay ALTER COLUMN replay_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_replay_replay_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: outbox_replay_rows; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_replay_rows (
    replay_id bigint NOT NULL,
    "position" bigint NOT NULL
);


--
-- Name: outbox_slot; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_slot (
    slot_name text NOT NULL,
    delivered_before timestamp with time zone,
    delivered_at timestamp with time zone,
    recovery_since timestamp with time zone,
    recovery_started_at timestamp with time zone,
    recovery_handed_over_at timestamp with time zone,
    recovery_replay_id bigint,
    recovery_expired integer,
    CONSTRAINT outbox_slot_check CHECK (((recovery_since IS NULL) = (recovery_started_at IS NULL))),
    CONSTRAINT outbox_slot_check1 CHECK (((recovery_handed_over_at IS NULL) OR (recovery_since IS NOT NULL))),
    CONSTRAINT outbox_slot_check2 CHECK (((recovery_replay_id IS NULL) OR (recovery_handed_over_at IS NOT NULL)))
);


--
-- Name: request_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.request_keys (
    caller text NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint text NOT NULL,
    order_id text NOT NULL,
    response jsonb NOT NULL,
    expires_at timestamp with time zone NOT NULL
);


--
-- Name: inbox inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (consumer, event_id);


--
-- Name: order_lines order_lines_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.order_lines
    ADD CONSTRAINT order_lines_pkey PRIMARY KEY (order_id, line_no);


--
-- Name: orders orders_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.orders
    ADD CONSTRAINT orders_pkey PRIMARY KEY (order_id);


--
-- Name: orders orders_rejection_only_when_rejected; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.orders
    ADD CONSTRAINT orders_rejection_only_when_rejected CHECK (((rejection IS NULL) OR (status = 'REJECTED'::text))) NOT VALID;


--
-- Name: outbox outbox_aggregate_id_sequence_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_aggregate_id_sequence_key UNIQUE (aggregate_id, sequence);


--
-- Name: outbox outbox_discard_recorded; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.outbox
    ADD CONSTRAINT outbox_discard_recorded CHECK ((((discarded_at IS NULL) AND (discarded_by IS NULL) AND (discard_reason IS NULL)) OR ((discarded_at IS NOT NULL) AND (parked_at IS NOT NULL) AND (COALESCE(discarded_by, ''::text) <> ''::text) AND (COALESCE(discard_reason, ''::text) <> ''::text)))) NOT VALID;


--
-- Name: outbox outbox_event_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_event_id_key UNIQUE (event_id);


--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY ("position");


--
-- Name: outbox_relay outbox_relay_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_relay
    ADD CONSTRAINT outbox_relay_pkey PRIMARY KEY (singleton);


--
-- Name: outbox_replay outbox_replay_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_replay
    ADD CONSTRAINT outbox_replay_pkey PRIMARY KEY (replay_id);


--
-- Name: outbox_replay_rows outbox_replay_rows_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_replay_rows
    ADD CONSTRAINT outbox_replay_rows_pkey PRIMARY KEY (replay_id, "position");


--
-- Name: outbox_replay outbox_replay_source_lsn_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_replay
    ADD CONSTRAINT outbox_replay_source_lsn_key UNIQUE (source_lsn);


--
-- Name: outbox_slot outbox_slot_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_slot
    ADD CONSTRAINT outbox_slot_pkey PRIMARY KEY (slot_name);


--
-- Name: request_keys request_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.request_keys
    ADD CONSTRAINT request_keys_pkey PRIMARY KEY (caller, idempotency_key);


--
-- Name: inbox_processed; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_processed ON public.inbox USING btree (processed_at);


--
-- Name: outbox_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_created ON public.outbox USING btree (created_at);


--
-- Name: outbox_parked; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_parked ON public.outbox USING btree ("position") WHERE (parked_at IS NOT NULL);


--
-- Name: outbox_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_pending ON public.outbox USING btree (aggregate_id, sequence) WHERE ((published_at IS NULL) AND (parked_at IS NULL));


--
-- Name: outbox_pending_age; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_pending_age ON public.outbox USING btree ("position") WHERE ((published_at IS NULL) AND (parked_at IS NULL));


--
-- Name: outbox_replay_rows_position; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_replay_rows_position ON public.outbox_replay_rows USING btree ("position");


--
-- Name: request_keys_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX request_keys_expiry ON public.request_keys USING btree (expires_at);


--
-- Name: order_lines order_lines_order_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.order_lines
    ADD CONSTRAINT order_lines_order_id_fkey FOREIGN KEY (order_id) REFERENCES public.orders(order_id) ON DELETE CASCADE;


--
-- Name: outbox_replay_rows outbox_replay_rows_position_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_replay_rows
    ADD CONSTRAINT outbox_replay_rows_position_fkey FOREIGN KEY ("position") REFERENCES public.outbox("position");


--
-- Name: outbox_replay_rows outbox_replay_rows_replay_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_replay_rows
    ADD CONSTRAINT outbox_replay_rows_replay_id_fkey FOREIGN KEY (replay_id) REFERENCES public.outbox_replay(replay_id) ON DELETE CASCADE;


--
-- Name: request_keys request_keys_order_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.request_keys
    ADD CONSTRAINT request_keys_order_id_fkey FOREIGN KEY (order_id) REFERENCES public.orders(order_id);


--
-- PostgreSQL database dump complete
--


