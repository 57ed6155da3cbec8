//! Each person's notification settings: which events they are emailed about.

use actix_web::{get, put, web};
use autodl_common::api::{ErrorBody, NotificationSettings, NotificationSettingsInput};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::notify::email::EMAIL_EVENTS;
use crate::notify::Event;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::usecases::notifications;

fn settings(state: &AppState, caller: &Caller, email: Vec<Event>) -> NotificationSettings {
    NotificationSettings {
        email: email.iter().map(|e| e.as_str().to_owned()).collect(),
        events: EMAIL_EVENTS.iter().map(|e| e.as_str().to_owned()).collect(),
        address: caller.user.email.clone(),
        email_available: state
            .settings
            .smtp_url
            .as_deref()
            .is_some_and(|u| !u.is_empty()),
    }
}

#[utoipa::path(responses((status = 200, body = NotificationSettings), (status = 401, body = ErrorBody)))]
#[get("/me/notifications")]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<NotificationSettings>, ApiError> {
    let email = notifications::email_events(&state, &caller).await?;
    Ok(web::Json(settings(&state, &caller, email)))
}

/// Chooses the events emailed to the caller (an empty list: none).
#[utoipa::path(request_body = NotificationSettingsInput, responses((status = 200, body = NotificationSettings), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[put("/me/notifications")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn update(
    state: web::Data<AppState>,
    caller: Caller,
    body: Json<NotificationSettingsInput>,
) -> Result<web::Json<NotificationSettings>, ApiError> {
    let mut email = Vec::new();
    for name in &body.email {
        let event = EMAIL_EVENTS
            .iter()
            .copied()
            .find(|e| e.as_str() == name)
            .ok_or_else(|| {
                ApiError::invalid(
                    "email",
                    format!(
                        "{name:?} is not an event; choose from {}",
                        EMAIL_EVENTS.map(Event::as_str).join(", ")
                    ),
                )
            })?;
        if !email.contains(&event) {
            email.push(event);
        }
    }
    let out = settings(&state, &caller, email.clone());
    if !email.is_empty() && !out.email_available {
        return Err(ApiError::Conflict(
            "this server sends no email: its operator sets AUTODL_SMTP_URL first".into(),
        ));
    }
    notifications::set_email_events(&state, &caller, &email).await?;
    Ok(web::Json(out))
}
