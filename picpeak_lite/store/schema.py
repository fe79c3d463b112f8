"""The database schema as numbered migrations keyed on ``PRAGMA user_version``.

``migrate`` applies every pending step in one ``BEGIN IMMEDIATE`` transaction at start-up: either all of them
land or none. A database written by a newer version of picpeak-lite is refused with a clear message rather than
being half-understood. Add a step by appending to ``MIGRATIONS``; never edit a step that has shipped.
"""

from __future__ import annotations

from picpeak_lite.errors import ConfigError
from picpeak_lite.store.db import Connection, transaction

# "PPKL": marks the file as ours, so that `file` and our own checks can tell it from other SQLite files.
APPLICATION_ID = 0x50504B4C

MIGRATIONS: tuple[str, ...] = (
    # 1: admin accounts, sessions, API tokens, galleries, guest sessions.
    """
    CREATE TABLE admin_users (
        id INTEGER PRIMARY KEY,
        username TEXT NOT NULL UNIQUE,
        password_hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        password_changed_at REAL NOT NULL
    ) STRICT;

    CREATE TABLE admin_sessions (
        id INTEGER PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        user_id INTEGER NOT NULL REFERENCES admin_users(id) ON DELETE CASCADE,
        csrf_token TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        revoked_at REAL
    ) STRICT;

    CREATE TABLE api_tokens (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        token_hash TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL,
        last_used_at REAL,
        revoked_at REAL
    ) STRICT;

    CREATE TABLE galleries (
        id INTEGER PRIMARY KEY,
        slug TEXT NOT NULL UNIQUE,
        share_token TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
        event_type TEXT NOT NULL DEFAULT 'other',
        event_date TEXT,
        customer_name TEXT NOT NULL DEFAULT '',
        customer_email TEXT NOT NULL DEFAULT '',
        welcome_message TEXT NOT NULL DEFAULT '',
        password_hash TEXT,
        password_version INTEGER NOT NULL DEFAULT 0,
        expires_at REAL,
        is_draft INTEGER NOT NULL DEFAULT 1 CHECK (is_draft IN (0, 1)),
        allow_guest_uploads INTEGER NOT NULL DEFAULT 0 CHECK (allow_guest_uploads IN (0, 1)),
        allow_downloads INTEGER NOT NULL DEFAULT 1 CHECK (allow_downloads IN (0, 1)),
        watermark INTEGER NOT NULL DEFAULT 0 CHECK (watermark IN (0, 1)),
        photo_cap INTEGER CHECK (photo_cap IS NULL OR photo_cap >= 1),
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) STRICT;

    CREATE TABLE guest_sessions (
        id INTEGER PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        csrf_token TEXT NOT NULL,
        guest_name TEXT,
        created_at REAL NOT NULL,
        last_seen_at REAL NOT NULL
    ) STRICT;

    -- A guest session that entered a gallery's password. Tied to the password's version, so that changing the
    -- password locks out everyone who entered the old one.
    CREATE TABLE gallery_access (
        guest_session_id INTEGER NOT NULL REFERENCES guest_sessions(id) ON DELETE CASCADE,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        password_version INTEGER NOT NULL,
        granted_at REAL NOT NULL,
        PRIMARY KEY (guest_session_id, gallery_id)
    ) STRICT;
    """,
    # 2: photos and their queue, upload groups, the webhook outbox.
    """
    CREATE TABLE uploads (
        id TEXT PRIMARY KEY CHECK (length(id) = 32),
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        uploaded_by TEXT NOT NULL CHECK (uploaded_by IN ('admin', 'guest')),
        guest_session_id INTEGER REFERENCES guest_sessions(id) ON DELETE SET NULL,
        guest_name TEXT,
        created_at REAL NOT NULL,
        completed_at REAL
    ) STRICT;

    CREATE TABLE photos (
        id INTEGER PRIMARY KEY,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        upload_id TEXT NOT NULL REFERENCES uploads(id) ON DELETE CASCADE,
        storage_key TEXT NOT NULL UNIQUE,
        sha256 TEXT NOT NULL CHECK (length(sha256) = 64),
        display_name TEXT NOT NULL,
        size INTEGER NOT NULL CHECK (size > 0),
        format TEXT NOT NULL CHECK (format IN ('jpeg', 'png', 'webp', 'heif')),
        uploaded_by TEXT NOT NULL CHECK (uploaded_by IN ('admin', 'guest')),
        guest_name TEXT,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'processing', 'complete', 'failed')),
        error TEXT CHECK (error IS NULL OR length(error) <= 1000),
        claim_token TEXT,
        lease_until REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        processing_started_at REAL,
        width INTEGER,
        height INTEGER,
        taken_at TEXT,
        camera_make TEXT,
        camera_model TEXT,
        lens TEXT,
        focal_length REAL,
        aperture REAL,
        exposure TEXT,
        iso INTEGER,
        has_gps INTEGER,
        hidden INTEGER NOT NULL DEFAULT 0 CHECK (hidden IN (0, 1)),
        created_at REAL NOT NULL,
        completed_at REAL,
        UNIQUE (gallery_id, sha256),
        CHECK (status != 'processing' OR (claim_token IS NOT NULL AND lease_until IS NOT NULL))
    ) STRICT;
    CREATE INDEX photos_queue ON photos(status, id);
    CREATE INDEX photos_by_upload ON photos(upload_id, id);
    CREATE INDEX photos_by_gallery ON photos(gallery_id, status, id);

    ALTER TABLE galleries ADD COLUMN cover_photo_id INTEGER REFERENCES photos(id) ON DELETE SET NULL;

    -- The outbox: written in the same transaction as the state change it reports. The id is derived from
    -- (event, subject), so reprocessing a photo can never produce a second delivery id.
    CREATE TABLE webhook_deliveries (
        id INTEGER PRIMARY KEY,
        event_id TEXT NOT NULL,
        endpoint_url TEXT NOT NULL,
        event_type TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        last_status_code INTEGER,
        last_error TEXT,
        delivered_at REAL,
        UNIQUE (event_id, endpoint_url)
    ) STRICT;
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries(status, next_attempt_at);
    """,
    # 3: the change feed (filled by triggers, so no write path can forget it), favourites, webhook endpoints
    # managed from the admin pages, and admin settings.
    """
    CREATE TABLE photo_changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        photo_id INTEGER NOT NULL,
        gallery_id INTEGER NOT NULL,
        upload_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'complete', 'failed', 'deleted')),
        hidden INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL DEFAULT (unixepoch('subsec'))
    ) STRICT;
    CREATE INDEX photo_changes_by_gallery ON photo_changes(gallery_id, seq);
    CREATE INDEX photo_changes_by_upload ON photo_changes(upload_id, seq);

    CREATE TRIGGER photos_change_insert AFTER INSERT ON photos BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden)
        VALUES (NEW.id, NEW.gallery_id, NEW.upload_id, NEW.status, NEW.hidden);
    END;
    CREATE TRIGGER photos_change_update AFTER UPDATE OF status, hidden ON photos
        WHEN OLD.status IS NOT NEW.status OR OLD.hidden IS NOT NEW.hidden BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden)
        VALUES (NEW.id, NEW.gallery_id, NEW.upload_id, NEW.status, NEW.hidden);
    END;
    CREATE TRIGGER photos_change_delete AFTER DELETE ON photos BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden)
        VALUES (OLD.id, OLD.gallery_id, OLD.upload_id, 'deleted', OLD.hidden);
    END;

    CREATE TABLE favourites (
        guest_session_id INTEGER NOT NULL REFERENCES guest_sessions(id) ON DELETE CASCADE,
        photo_id INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        PRIMARY KEY (guest_session_id, photo_id)
    ) STRICT;
    CREATE INDEX favourites_by_photo ON favourites(photo_id);

    CREATE TABLE webhook_endpoints (
        id INTEGER PRIMARY KEY,
        url TEXT NOT NULL UNIQUE,
        secret TEXT NOT NULL,
        events TEXT NOT NULL,
        active INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),
        created_at REAL NOT NULL
    ) STRICT;

    CREATE TABLE app_settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;
    """,
    # 4: guests page through a gallery by capture time; this partial index makes each page's cost independent
    # of the gallery's size (the expression is queries.listing.TAKEN_KEY, the condition is
    # queries.photos.GUEST_VISIBLE_PHOTO).
    """
    CREATE INDEX photos_guest_taken ON photos(
        gallery_id, coalesce(taken_at, strftime('%Y-%m-%dT%H:%M:%S', created_at, 'unixepoch')), id
    ) WHERE status = 'complete' AND hidden = 0;
    """,
    # 5: a photo id is never given twice. Without AUTOINCREMENT (which needs a table rebuild) SQLite gives the
    # next photo the highest id deleted before it, and browsers cache images by URL for a week, webhook
    # receivers and the change log know photos by id. queries.photos.insert_photo takes ids from this counter;
    # it starts past every id the photos table and the change log still remember.
    """
    CREATE TABLE photo_id_counter (next_id INTEGER NOT NULL) STRICT;
    INSERT INTO photo_id_counter (next_id) SELECT max(
        (SELECT coalesce(max(id), 0) FROM photos), (SELECT coalesce(max(photo_id), 0) FROM photo_changes)) + 1;
    """,
    # 6: view images follow the watermark. A change to a gallery's watermark (or to the settings behind it)
    # counts up views_stale on its photos; an idle worker makes their images again and sets it back to 0 only
    # if nothing counted it up meanwhile. The photo stays complete and visible throughout.
    """
    ALTER TABLE photos ADD COLUMN views_stale INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX photos_views_stale ON photos(id) WHERE views_stale > 0;
    """,
    # 7: an upload's photos are claimable while its request is still arriving (issue 18). receiving_until is
    # the lease of the request that is still sending (NULL once it has ended): while it is set the upload is not
    # complete, whatever its photos' states. provisional marks a photo whose request has not been answered 202
    # yet: if that request fails or its process dies (the lease runs out), exactly these rows are taken back.
    # Another request told "already in the gallery" about such a photo makes it permanent (provisional = 0).
    """
    ALTER TABLE uploads ADD COLUMN receiving_until REAL;
    CREATE INDEX uploads_receiving ON uploads(receiving_until) WHERE receiving_until IS NOT NULL;
    ALTER TABLE photos ADD COLUMN provisional INTEGER NOT NULL DEFAULT 0 CHECK (provisional IN (0, 1));
    """,
    # Moderation (issue 16): a gallery may hold guests' photos back until the admin approves them. The rule is
    # in the schema, so that every way a guest photo arrives (multipart, resumable uploads, another process)
    # obeys it: a trigger marks a guest's photo awaiting_approval when it is inserted into such a gallery; only
    # the admin's review clears the mark (approve, or hide / delete: rejected). Guests see no marked photo
    # (queries.photos.GUEST_VISIBLE_PHOTO), but the change log carries the mark, so the feeds can tell. The
    # change triggers are made again to record it; they are otherwise as in step 3.
    """
    ALTER TABLE galleries ADD COLUMN guest_photos_need_approval INTEGER NOT NULL DEFAULT 0
        CHECK (guest_photos_need_approval IN (0, 1));
    ALTER TABLE photos ADD COLUMN awaiting_approval INTEGER NOT NULL DEFAULT 0 CHECK (awaiting_approval IN (0, 1));
    ALTER TABLE photo_changes ADD COLUMN awaiting_approval INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX photos_awaiting_approval ON photos(gallery_id, id) WHERE awaiting_approval = 1;

    DROP TRIGGER photos_change_insert;
    DROP TRIGGER photos_change_update;
    DROP TRIGGER photos_change_delete;
    CREATE TRIGGER photos_change_insert AFTER INSERT ON photos BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval)
        VALUES (NEW.id, NEW.gallery_id, NEW.upload_id, NEW.status, NEW.hidden, NEW.awaiting_approval);
    END;
    CREATE TRIGGER photos_change_update AFTER UPDATE OF status, hidden, awaiting_approval ON photos
        WHEN OLD.status IS NOT NEW.status OR OLD.hidden IS NOT NEW.hidden
            OR OLD.awaiting_approval IS NOT NEW.awaiting_approval BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval)
        VALUES (NEW.id, NEW.gallery_id, NEW.upload_id, NEW.status, NEW.hidden, NEW.awaiting_approval);
    END;
    CREATE TRIGGER photos_change_delete AFTER DELETE ON photos BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval)
        VALUES (OLD.id, OLD.gallery_id, OLD.upload_id, 'deleted', OLD.hidden, OLD.awaiting_approval);
    END;
    CREATE TRIGGER photos_await_approval AFTER INSERT ON photos
        WHEN NEW.uploaded_by = 'guest'
            AND (SELECT guest_photos_need_approval FROM galleries WHERE id = NEW.gallery_id) = 1 BEGIN
        UPDATE photos SET awaiting_approval = 1 WHERE id = NEW.id;
    END;
    """,
    # Proofing (issue 16): the most favourites each guest may choose in a gallery ("choose up to 40"); NULL: no
    # limit. The photographer exports the choices (queries.proofing), by guest name.
    """
    ALTER TABLE galleries ADD COLUMN favourite_limit INTEGER CHECK (favourite_limit IS NULL OR favourite_limit >= 1);
    CREATE INDEX favourites_by_session ON favourites(guest_session_id, created_at);
    """,
    # The live wall (issue 16): a slideshow page opened by the admin, or by a link with its own token
    # (wall_token, NULL: no link; a new one replaces it, and clearing it revokes the link), and whether it shows
    # guests' names under their photos (wall_captions).
    """
    ALTER TABLE galleries ADD COLUMN wall_token TEXT;
    CREATE UNIQUE INDEX galleries_wall_token ON galleries(wall_token) WHERE wall_token IS NOT NULL;
    ALTER TABLE galleries ADD COLUMN wall_captions INTEGER NOT NULL DEFAULT 0 CHECK (wall_captions IN (0, 1));
    """,
    # Activity (issue 16): per gallery and UTC day, how often something happened (views, downloads of one photo
    # or a zip, favourites given). Counted in memory and added here in batches (runtime/activity.py), so a busy
    # gallery costs one small transaction every few seconds, not a write per request.
    """
    CREATE TABLE gallery_activity (
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        day TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('views', 'downloads_single', 'downloads_zip', 'favourites')),
        count INTEGER NOT NULL CHECK (count >= 0),
        PRIMARY KEY (gallery_id, day, kind)
    ) STRICT, WITHOUT ROWID;
    """,
    # tus: resumable uploads (issue 14). One row per file sent with the tus protocol, its bytes in
    # tmp/tus/<id>. upload_offset is what is durable (fsynced before it is written here); upload_id is the
    # upload group the photo joins, created with the first file of a batch and receiving until its last file
    # has ended. A finished row (state 'done') stays until expires_at, so that a client that lost the last
    # answer can still ask for its photo; an expired one stays as a tombstone (410) for a second period.
    """
    CREATE TABLE tus_uploads (
        id TEXT PRIMARY KEY CHECK (length(id) = 32),
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        uploaded_by TEXT NOT NULL CHECK (uploaded_by IN ('admin', 'guest')),
        guest_session_id INTEGER REFERENCES guest_sessions(id) ON DELETE CASCADE,
        upload_id TEXT REFERENCES uploads(id) ON DELETE SET NULL,
        group_key TEXT,
        upload_length INTEGER NOT NULL CHECK (upload_length >= 0),
        upload_offset INTEGER NOT NULL DEFAULT 0 CHECK (upload_offset BETWEEN 0 AND upload_length),
        metadata TEXT NOT NULL DEFAULT '',
        filename TEXT NOT NULL,
        guest_name TEXT,
        state TEXT NOT NULL DEFAULT 'receiving' CHECK (state IN ('receiving', 'done', 'expired')),
        photo_id INTEGER,
        duplicate INTEGER NOT NULL DEFAULT 0 CHECK (duplicate IN (0, 1)),
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    ) STRICT;
    CREATE INDEX tus_uploads_expiry ON tus_uploads(expires_at);
    CREATE INDEX tus_uploads_group ON tus_uploads(upload_id) WHERE state = 'receiving';
    CREATE INDEX tus_uploads_owner ON tus_uploads(gallery_id, uploaded_by, guest_session_id)
        WHERE state = 'receiving';
    """,
    # videos (issue 13): a photo row is a photo or a video (media_type), with the probe's facts. format takes
    # the containers too. Its CHECK is widened by SQLite's documented way to change a constraint in place
    # (https://sqlite.org/lang_altertable.html, "making other kinds of table schema changes"): the table's SQL
    # text is edited, and the ALTERs before it bump the schema cookie so every connection re-reads it. A rebuild
    # of photos (triggers, indexes, other branches' columns) would be far more to get wrong. preview_status:
    # NULL when the original plays in browsers; else the playable MP4 preview's state ('pending', 'complete',
    # 'failed'), made by the preview lane (pipeline/video_previews.py). preview_error: its readable reason.
    """
    ALTER TABLE photos ADD COLUMN media_type TEXT NOT NULL DEFAULT 'photo' CHECK (media_type IN ('photo', 'video'));
    ALTER TABLE photos ADD COLUMN duration REAL CHECK (duration IS NULL OR duration >= 0);
    ALTER TABLE photos ADD COLUMN fps REAL;
    ALTER TABLE photos ADD COLUMN video_codec TEXT;
    ALTER TABLE photos ADD COLUMN audio_codec TEXT;
    ALTER TABLE photos ADD COLUMN preview_status TEXT
        CHECK (preview_status IS NULL OR preview_status IN ('pending', 'complete', 'failed'));
    ALTER TABLE photos ADD COLUMN preview_error TEXT;
    CREATE INDEX photos_previews ON photos(id) WHERE preview_status = 'pending';
    PRAGMA writable_schema = ON;
    UPDATE sqlite_schema SET sql = replace(sql, 'CHECK (format IN (''jpeg'', ''png'', ''webp'', ''heif''))',
        'CHECK (format IN (''jpeg'', ''png'', ''webp'', ''heif'', ''mp4'', ''mov'', ''webm''))')
        WHERE type = 'table' AND name = 'photos';
    PRAGMA writable_schema = RESET;
    """,
    # tus reservations charged to their owner (issue 27): the client address that created an unfinished upload,
    # so that guests' announced bytes are capped per address across sessions (pipeline/resumable.py). NULL on
    # rows made before this step (they count against no address).
    """
    ALTER TABLE tus_uploads ADD COLUMN client_ip TEXT;
    CREATE INDEX tus_uploads_client ON tus_uploads(client_ip) WHERE state = 'receiving';
    """,
    # finishing tus uploads (issue 28): once every byte is durable (upload_offset = upload_length, still
    # 'receiving') making the photo is the server's job, retried (pipeline/resumable.py Finisher) until the photo
    # exists or the file is refused. finish_attempts / finish_after: failed tries and when the next is due
    # (NULL: at once); error / error_status: why a 'done' upload has no photo (a refusal, or the final failure),
    # told to HEAD and PATCH for as long as the row is kept.
    """
    ALTER TABLE tus_uploads ADD COLUMN finish_attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tus_uploads ADD COLUMN finish_after REAL;
    ALTER TABLE tus_uploads ADD COLUMN error TEXT;
    ALTER TABLE tus_uploads ADD COLUMN error_status INTEGER;
    CREATE INDEX tus_uploads_finishing ON tus_uploads(finish_after)
        WHERE state = 'receiving' AND upload_offset = upload_length;
    """,
    # interrupted attempts (issue 28): an attempt whose process died (its lease ran out with nobody renewing it)
    # no longer counts in ``attempts``, since nothing a photo contains runs in the server (pipeline/imageprocs.py):
    # it counts here instead, and a photo interrupted transitions.MAX_INTERRUPTIONS times is still given up.
    """
    ALTER TABLE photos ADD COLUMN interruptions INTEGER NOT NULL DEFAULT 0 CHECK (interruptions >= 0);
    """,
    # grids follow the watermark too (issue 35): a tile may show the grid or the view image (srcset), so the
    # grid is now made from the watermarked view. Photos of watermarked galleries made before have unmarked
    # grids: they are marked stale, and idle workers make both images again (WorkerPool.refresh_stale_views).
    """
    UPDATE photos SET views_stale = views_stale + 1
        WHERE status IN ('processing', 'complete') AND gallery_id IN (SELECT id FROM galleries WHERE watermark = 1);
    """,
    # Feedback (issue 34): guests' likes, 1-5 star ratings (one of each per guest session and photo, changeable)
    # and comments, which a gallery with hold_comments keeps 'held' until the admin approves ('approved') or
    # rejects ('rejected') them. A comment keeps the name its author gave (the session may be forgotten later).
    # The change log carries feedback too (feedback = 1, the photo's state copied), written by triggers as
    # photos' changes are, so the live feeds tell the photographer and guests of it and no write path can
    # forget to; the photo feeds' other readers (upload feeds, the backlog) skip those rows.
    """
    ALTER TABLE galleries ADD COLUMN hold_comments INTEGER NOT NULL DEFAULT 0 CHECK (hold_comments IN (0, 1));
    CREATE TABLE photo_likes (
        guest_session_id INTEGER NOT NULL REFERENCES guest_sessions(id) ON DELETE CASCADE,
        photo_id INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        PRIMARY KEY (guest_session_id, photo_id)
    ) STRICT;
    CREATE INDEX photo_likes_by_photo ON photo_likes(photo_id);
    CREATE TABLE photo_ratings (
        guest_session_id INTEGER NOT NULL REFERENCES guest_sessions(id) ON DELETE CASCADE,
        photo_id INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
        stars INTEGER NOT NULL CHECK (stars BETWEEN 1 AND 5),
        rated_at REAL NOT NULL,
        PRIMARY KEY (guest_session_id, photo_id)
    ) STRICT;
    CREATE INDEX photo_ratings_by_photo ON photo_ratings(photo_id);
    CREATE TABLE photo_comments (
        id INTEGER PRIMARY KEY,
        photo_id INTEGER NOT NULL REFERENCES photos(id) ON DELETE CASCADE,
        guest_session_id INTEGER REFERENCES guest_sessions(id) ON DELETE SET NULL,
        guest_name TEXT NOT NULL CHECK (length(guest_name) BETWEEN 1 AND 100),
        body TEXT NOT NULL CHECK (length(body) BETWEEN 1 AND 2000),
        status TEXT NOT NULL CHECK (status IN ('held', 'approved', 'rejected')),
        created_at REAL NOT NULL,
        reviewed_at REAL
    ) STRICT;
    CREATE INDEX photo_comments_by_photo ON photo_comments(photo_id, id);
    CREATE INDEX photo_comments_held ON photo_comments(photo_id) WHERE status = 'held';
    CREATE INDEX photo_comments_by_session ON photo_comments(guest_session_id, created_at);

    ALTER TABLE photo_changes ADD COLUMN feedback INTEGER NOT NULL DEFAULT 0;
    CREATE TRIGGER photo_likes_change_insert AFTER INSERT ON photo_likes BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = NEW.photo_id;
    END;
    CREATE TRIGGER photo_likes_change_delete AFTER DELETE ON photo_likes BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = OLD.photo_id;
    END;
    CREATE TRIGGER photo_ratings_change_insert AFTER INSERT ON photo_ratings BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = NEW.photo_id;
    END;
    CREATE TRIGGER photo_ratings_change_update AFTER UPDATE OF stars ON photo_ratings
        WHEN OLD.stars IS NOT NEW.stars BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = NEW.photo_id;
    END;
    CREATE TRIGGER photo_ratings_change_delete AFTER DELETE ON photo_ratings BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = OLD.photo_id;
    END;
    CREATE TRIGGER photo_comments_change_insert AFTER INSERT ON photo_comments BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = NEW.photo_id;
    END;
    CREATE TRIGGER photo_comments_change_update AFTER UPDATE OF status ON photo_comments
        WHEN OLD.status IS NOT NEW.status BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = NEW.photo_id;
    END;
    CREATE TRIGGER photo_comments_change_delete AFTER DELETE ON photo_comments BEGIN
        INSERT INTO photo_changes (photo_id, gallery_id, upload_id, status, hidden, awaiting_approval, feedback)
        SELECT id, gallery_id, upload_id, status, hidden, awaiting_approval, 1 FROM photos WHERE id = OLD.photo_id;
    END;
    """,
    # a brand of its own (issue 33): each gallery may choose its theme and its cover's layout; '' follows the
    # install's default (domain/brand.py, the admin settings' brand).
    """
    ALTER TABLE galleries ADD COLUMN theme TEXT NOT NULL DEFAULT ''
        CHECK (theme IN ('', 'auto', 'light', 'dark'));
    ALTER TABLE galleries ADD COLUMN cover_layout TEXT NOT NULL DEFAULT ''
        CHECK (cover_layout IN ('', 'full', 'split', 'minimal'));
    """,
    # accounts with roles (issue 33): every account is an owner, an admin or an editor (the one made at first
    # start, and any made before this step, is an owner); disabled_at ends its sessions and tokens at their next
    # request (domain/accounts.py). An optional TOTP second factor (totp_secret, base32; totp_enabled_at set
    # once a code from it was given; totp_last_step: the newest step used, so no code works twice) with
    # single-use recovery codes (only their SHA-256). An editor reaches
    # only the galleries in gallery_grants. API tokens belong to an account (those made before: the first
    # owner's). A session whose password was right but whose second factor is still due is pending_totp.
    # The audit trail: who did what and when, kept audit_retention_days; gallery and account names are copied,
    # so that a row still reads after the gallery or the account is gone.
    """
    ALTER TABLE admin_users ADD COLUMN role TEXT NOT NULL DEFAULT 'owner' CHECK (role IN ('owner', 'admin', 'editor'));
    ALTER TABLE admin_users ADD COLUMN disabled_at REAL;
    ALTER TABLE admin_users ADD COLUMN totp_secret TEXT;
    ALTER TABLE admin_users ADD COLUMN totp_enabled_at REAL;
    ALTER TABLE admin_users ADD COLUMN totp_last_step INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE admin_sessions ADD COLUMN pending_totp INTEGER NOT NULL DEFAULT 0 CHECK (pending_totp IN (0, 1));
    ALTER TABLE api_tokens ADD COLUMN user_id INTEGER REFERENCES admin_users(id) ON DELETE CASCADE;
    UPDATE api_tokens SET user_id = (SELECT min(id) FROM admin_users);

    CREATE TABLE recovery_codes (
        id INTEGER PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES admin_users(id) ON DELETE CASCADE,
        code_hash TEXT NOT NULL,
        used_at REAL
    ) STRICT;
    CREATE INDEX recovery_codes_user ON recovery_codes(user_id);

    CREATE TABLE gallery_grants (
        user_id INTEGER NOT NULL REFERENCES admin_users(id) ON DELETE CASCADE,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        PRIMARY KEY (user_id, gallery_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX gallery_grants_gallery ON gallery_grants(gallery_id);

    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        account_id INTEGER REFERENCES admin_users(id) ON DELETE SET NULL,
        account_name TEXT NOT NULL,
        action TEXT NOT NULL,
        gallery_id INTEGER,
        gallery_name TEXT,
        ip TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT ''
    ) STRICT;
    CREATE INDEX audit_log_at ON audit_log(at);
    CREATE INDEX audit_log_account ON audit_log(account_id, at);
    CREATE INDEX audit_log_gallery ON audit_log(gallery_id, at);
    """,
    # email (issue 32): the outbox of messages, each stored whole (headers, parts, its Message-ID made once when it
    # was queued), so every attempt sends the same bytes and a retry is never a second message. dedup_key names
    # what a message is about ("reminder:<gallery>:<expiry>:client"): queuing it again is no second row.
    # recipient is kept for the log and the SMTP envelope; gallery_id for the digest's "one per interval".
    """
    CREATE TABLE email_outbox (
        id INTEGER PRIMARY KEY,
        message_id TEXT NOT NULL UNIQUE,
        dedup_key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        gallery_id INTEGER REFERENCES galleries(id) ON DELETE SET NULL,
        recipient TEXT NOT NULL,
        subject TEXT NOT NULL,
        message BLOB NOT NULL,
        created_at REAL NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        last_error TEXT,
        last_reply TEXT,
        sent_at REAL
    ) STRICT;
    CREATE INDEX email_outbox_due ON email_outbox(status, next_attempt_at);
    CREATE INDEX email_outbox_sent ON email_outbox(sent_at) WHERE sent_at IS NOT NULL;
    CREATE INDEX email_outbox_gallery ON email_outbox(gallery_id, kind, created_at);
    """,
    # archive and restore (issue 34): the gallery row is the state machine of pipeline/archive.py (active ->
    # archiving -> archived -> restoring -> active; every step idempotent, resumed at start-up). on_expiry: the
    # photographer's choice of what happens when the gallery expires ('archive' is done by the archiver task).
    # archive_object: the storage name of the packed originals, set only once that object was read back and every
    # original's sha256 matched; the loose originals are removed only after it is set. archive_bytes_before /
    # _after: the gallery's stored bytes before and after archiving (the space freed is their difference).
    # archive_error: why the last archiving or restoring stopped (shown on the admin's gallery page).
    """
    ALTER TABLE galleries ADD COLUMN on_expiry TEXT NOT NULL DEFAULT 'keep' CHECK (on_expiry IN ('keep', 'archive'));
    ALTER TABLE galleries ADD COLUMN archive_state TEXT NOT NULL DEFAULT 'active'
        CHECK (archive_state IN ('active', 'archiving', 'archived', 'restoring'));
    ALTER TABLE galleries ADD COLUMN archive_object TEXT;
    ALTER TABLE galleries ADD COLUMN archive_bytes_before INTEGER;
    ALTER TABLE galleries ADD COLUMN archive_bytes_after INTEGER;
    ALTER TABLE galleries ADD COLUMN archived_at REAL;
    ALTER TABLE galleries ADD COLUMN archive_error TEXT;
    CREATE INDEX galleries_archive_work ON galleries(archive_state) WHERE archive_state != 'active';
    """,
    # hot folders (issue 34): a gallery's folder that the server watches (hot_folder, NULL: none; with
    # hot_folder_in_place its originals are links to the folder's files instead of copies), and every file
    # a hot folder has taken, by its path, size and modification time, so that a restart (or `picpeak-lite watch`
    # run again) takes each file once. photo_id is the photo it became (NULL when it was refused: error says why;
    # a photo deleted later is not brought back).
    """
    ALTER TABLE galleries ADD COLUMN hot_folder TEXT;
    ALTER TABLE galleries ADD COLUMN hot_folder_in_place INTEGER NOT NULL DEFAULT 0
        CHECK (hot_folder_in_place IN (0, 1));
    CREATE TABLE hot_folder_files (
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        size INTEGER NOT NULL,
        mtime_ns INTEGER NOT NULL,
        photo_id INTEGER,
        error TEXT,
        taken_at REAL NOT NULL,
        PRIMARY KEY (gallery_id, path)
    ) STRICT;
    """,
    # replacing a photo (issue 34): a re-edited file takes the photo's place (same id, capture time, favourites);
    # until the photographer confirms, ``replaced`` holds what the photo was (JSON: its storage_key, sha256, size,
    # format, dimensions and EXIF facts; queries.replacement.KEPT), its original and images still stored, so that
    # revert brings it back at once.
    """
    ALTER TABLE photos ADD COLUMN replaced TEXT;
    CREATE INDEX photos_replaced ON photos(gallery_id) WHERE replaced IS NOT NULL;
    """,
    # Languages (issue 32): the language the photographer chose for the gallery's guests; NULL lets each guest's
    # browser decide (picpeak_lite/i18n.py choose()).
    """
    ALTER TABLE galleries ADD COLUMN language TEXT CHECK (language IS NULL OR length(language) BETWEEN 2 AND 10);
    """,
    # "Find me" (issue 36): a gallery's opt-in (find_me) and whether guests' own photos are indexed too
    # (find_me_guest_uploads). faces: each face found in a photo's view image, only its box and its embedding
    # (128 float32, 512 bytes; media/faces.py), never a picture. face_scans: one row per photo looked at (its
    # faces stored in the same transaction), so the index is its own queue: a photo without a row is still to
    # do, after a crash too. Both go with their photo or gallery (ON DELETE CASCADE).
    """
    ALTER TABLE galleries ADD COLUMN find_me INTEGER NOT NULL DEFAULT 0 CHECK (find_me IN (0, 1));
    ALTER TABLE galleries ADD COLUMN find_me_guest_uploads INTEGER NOT NULL DEFAULT 0
        CHECK (find_me_guest_uploads IN (0, 1));
    CREATE TABLE face_scans (
        photo_id INTEGER PRIMARY KEY REFERENCES photos(id) ON DELETE CASCADE,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        faces INTEGER NOT NULL,
        error TEXT,
        scanned_at REAL NOT NULL
    ) STRICT;
    CREATE INDEX face_scans_gallery ON face_scans(gallery_id);
    CREATE TABLE faces (
        id INTEGER PRIMARY KEY,
        photo_id INTEGER NOT NULL REFERENCES face_scans(photo_id) ON DELETE CASCADE,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        box_left INTEGER NOT NULL,
        box_top INTEGER NOT NULL,
        box_right INTEGER NOT NULL,
        box_bottom INTEGER NOT NULL,
        embedding BLOB NOT NULL CHECK (length(embedding) = 512)
    ) STRICT;
    CREATE INDEX faces_gallery ON faces(gallery_id);
    CREATE INDEX faces_photo ON faces(photo_id);
    """,
    # Changes pushed, not polled (issue 30): PostgreSQL's step adds the NOTIFY triggers of events/listener.py.
    # SQLite has no notifications (a process learns of another's commits by the change feed's poll), so its step
    # is empty; it exists so that both engines count the same versions.
    """
    -- nothing to change on SQLite
    """,
    # key reservations (issue 30): a storage key an upload is writing its original under, reserved in a short
    # transaction before the file is written and taken (deleted) in the transaction that inserts its row. The
    # reconciler never removes the files of a key with a row or a live reservation; an expired reservation it
    # deletes first, in its own transaction, and removes the files after that commit. So uploads and the
    # reconciler agree through these rows alone, with no storage call inside a write (pipeline/janitor.py).
    """
    CREATE TABLE key_reservations (
        storage_key TEXT PRIMARY KEY,
        reserved_at REAL NOT NULL
    ) STRICT;
    CREATE INDEX key_reservations_age ON key_reservations(reserved_at);
    """,
    # Limits for the whole service, not per process (issue 31): web/ratelimit.py's token buckets and
    # web/throttle.py's password attempts. rate_buckets: one row per (bucket, key) with the tokens held at ``at``
    # (epoch seconds; negative is debt) and full_at, when it holds its burst again: from then on the row says
    # nothing a missing row would not, and the janitor removes it. granted: whether the last take was granted
    # (what the one statement that decides returns). password_attempts: one row per failed attempt, or per
    # attempt in flight (pending_until set: it counts as a failure until its answer is known or until then, so a
    # crashed process does not hold it forever); forget_at: when the row may go.
    """
    CREATE TABLE rate_buckets (
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        tokens REAL NOT NULL,
        at REAL NOT NULL,
        full_at REAL NOT NULL,
        granted INTEGER NOT NULL,
        PRIMARY KEY (bucket, key)
    ) STRICT;
    CREATE INDEX rate_buckets_full ON rate_buckets(full_at);
    CREATE TABLE password_attempts (
        id INTEGER PRIMARY KEY,
        throttle TEXT NOT NULL,
        target TEXT NOT NULL,
        client TEXT NOT NULL,
        at REAL NOT NULL,
        pending_until REAL,
        forget_at REAL NOT NULL
    ) STRICT;
    CREATE INDEX password_attempts_key ON password_attempts(throttle, target, client, at);
    CREATE INDEX password_attempts_forget ON password_attempts(forget_at);
    """,
    # 30: several processes, one service (issues 29 and 31). leases: what one process of the service does at a
    # time (runtime/lease.py): its holder (a process's instance id), the token its writes are fenced by, and
    # until when it holds (epoch seconds; past it any process may take it). findme_not_me: the faces a guest said
    # were not them, per guest session and gallery, so that every process knows.
    """
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        token TEXT NOT NULL,
        expires_at REAL NOT NULL
    ) STRICT;
    CREATE TABLE findme_not_me (
        guest_session_id INTEGER NOT NULL REFERENCES guest_sessions(id) ON DELETE CASCADE,
        gallery_id INTEGER NOT NULL REFERENCES galleries(id) ON DELETE CASCADE,
        face_id INTEGER NOT NULL,
        PRIMARY KEY (guest_session_id, gallery_id, face_id)
    ) STRICT, WITHOUT ROWID;
    """,
    # 31: which process claimed a photo (issue 31, several hosts): "<host name> pid <pid>", set by each claim and
    # kept after it ends, so an operator (and the multi-host suite) can tell which host holds or made a photo.
    """
    ALTER TABLE photos ADD COLUMN claimed_by TEXT;
    """,
    # 32: tus across processes (issue 31): who is writing an upload and who is making its photo are held
    # in its row, not in one process's memory (pipeline/resumable.py). writer_id / writer_token / writer_until:
    # the writer lease (the holding process's Services.instance, its request's token, until when; renewed
    # while bytes flow, NULL when nobody writes). finish_token / finish_until: the claim of a try at making the
    # photo (as photos.claim_token / lease_until; its deadline sized to the file).
    """
    ALTER TABLE tus_uploads ADD COLUMN writer_id TEXT;
    ALTER TABLE tus_uploads ADD COLUMN writer_token TEXT;
    ALTER TABLE tus_uploads ADD COLUMN writer_until REAL;
    ALTER TABLE tus_uploads ADD COLUMN finish_token TEXT;
    ALTER TABLE tus_uploads ADD COLUMN finish_until REAL;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: Connection, *, target: int | None = None) -> int:
    """Bring the database up to ``target`` (default: the newest). Returns the version it started at."""
    newest = len(MIGRATIONS)
    if conn.dialect == "postgresql":
        from picpeak_lite.store import schema_pg

        return schema_pg.migrate(conn, newest, target=target)
    target = newest if target is None else target
    with transaction(conn):
        current = conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]
        app_id = conn.execute("PRAGMA application_id").fetchall()[0]["application_id"]
        if app_id not in (0, APPLICATION_ID):
            raise ConfigError(f"{conn.filename} is not a picpeak-lite database (application_id {app_id:#x})")
        if current > newest:
            raise ConfigError(
                f"the database {conn.filename} has schema version {current}, newer than this picpeak-lite "
                f"understands ({newest}); upgrade picpeak-lite or restore a backup"
            )
        for version in range(current + 1, target + 1):
            conn.execute(MIGRATIONS[version - 1])
        if target > current:
            # PRAGMAs take no parameters; both values are integers we control.
            conn.execute(f"PRAGMA user_version = {int(target)}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    return current
